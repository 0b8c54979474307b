#!/usr/bin/env python3
"""A release tag names the version it releases: `v` and the package's version,
engine/pyproject.toml's (pipeline.source.engine_version: what the wheels and
the manifest carry). The release workflow (ci/github-actions/release.yml)
checks the pushed tag with this before anything is built:

    python3 ci/release_tag.py v0.1.0

exits 0 when the tag is the version's, else names both and exits 1 (also as
a GitHub Actions error annotation under GITHUB_ACTIONS). Standard library only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.source import engine_version  # noqa: E402  (standard library only)


def problem(tag: str, root: Path = ROOT) -> str | None:
    """Why `tag` cannot release the package at `root`, or None."""
    version = engine_version(root)
    if tag == f"v{version}":
        return None
    return (
        f"the tag {tag!r} does not name the package's version {version} (engine/pyproject.toml): "
        f"a release of {version} is tagged v{version}; tag that, or change the version and tag again"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 ci/release_tag.py TAG (e.g. v0.1.0)", file=sys.stderr)
        return 2
    found = problem(argv[0].removeprefix("refs/tags/"))
    if found is None:
        print(f"tag {argv[0]} is the package's version")
        return 0
    if os.environ.get("GITHUB_ACTIONS") == "true":  # an annotation: read from stdout
        print(f"::error title=release tag::{found}", flush=True)
    print(f"error: {found}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
