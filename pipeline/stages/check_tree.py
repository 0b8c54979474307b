"""Stage: check-tree. A release is made from a commit: uncommitted changes
(modified, staged, deleted or untracked files) stop it, unless --allow-dirty
was given; the build record and the manifest then say tree_dirty: true."""

from __future__ import annotations

from pathlib import Path

from pipeline import source
from pipeline.errors import DirtyTreeError
from pipeline.paths import ROOT
from pipeline.run import Run


def check_tree(*, allow_dirty: bool, root: Path = ROOT) -> None:
    changes = source.tree_changes(root)
    if changes and not allow_dirty:
        raise DirtyTreeError(
            f"the working tree has {len(changes)} uncommitted change(s) (first: {changes[0].strip()}); "
            f"a release is made from a commit. Commit or stash them, or pass --allow-dirty "
            f"(the manifest then records tree_dirty: true)"
        )


def execute(run: Run) -> None:
    check_tree(allow_dirty=run.options.allow_dirty)
    run.say(
        "the working tree is clean"
        if not source.tree_changes()
        else "dirty tree allowed (recorded in the manifest: tree_dirty true)"
    )
