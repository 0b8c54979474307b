"""What one stage reads of another's output is a plain file, never a symbolic
link: a link can be re-pointed after a check, and inside a container (the
audit's load check, the runtime image's build) it dangles. Each stage refuses
one by name, before any work, with its own error."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .errors import PipelineError


def refuse_links(paths: Iterable[Path], what: str, error: type[PipelineError]) -> list[Path]:
    """`paths` as a list; `error` naming the first that is a symbolic link."""
    paths = list(paths)
    for path in paths:
        if path.is_symlink():
            raise error(f"{path}: a symbolic link (to {os.readlink(path)}), not the {what} itself; "
                        f"the release's stages read files, never links (a link can be re-pointed "
                        f"after the check): put the file there and re-run")
    return paths
