"""The checkout a release is made from: its commit, its uncommitted changes,
the commit's time and the engine's version. Every question the pipeline asks
git goes through here."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

from pipeline.paths import ROOT


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def commit() -> str:
    return git("rev-parse", "HEAD")


def tree_changes(root: Path = ROOT) -> list[str]:
    """Every change against HEAD a build could pick up: modified, staged,
    deleted and untracked (not ignored) files, each listed."""
    return git("status", "--porcelain", "--untracked-files=all", cwd=root).splitlines()


def source_date_epoch() -> str:
    return git("log", "-1", "--format=%ct")


def engine_version() -> str:
    """The engine's version (engine/pyproject.toml): the release's version."""
    return tomllib.loads((ROOT / "engine" / "pyproject.toml").read_text())["project"]["version"]
