"""The checkout a release is made from: its commit, its uncommitted changes,
the commit's time, the engine's version and the snapshot of the engine's
source that the wheels and the launcher are built from. Every question the
pipeline asks git goes through here."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

from pipeline.paths import ROOT

# The engine's project: its CMake build and its pyproject (the wheel).
ENGINE = "engine"
# What building the engine reads: its project, and the build-time metadata
# hook its pyproject names (kept outside engine/, which holds no Python).
SOURCE_PATHS = (ENGINE, "packaging/build_support")
# Of those, what no wheel holds: the C++ tests and benchmarks, built only with
# ACTIVEKV_BUILD_TESTS / ACTIVEKV_BUILD_BENCH, which the wheels leave off.
NOT_IN_WHEELS = (f"{ENGINE}/tests", f"{ENGINE}/bench")


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def commit() -> str:
    return git("rev-parse", "HEAD")


def tree_changes(root: Path = ROOT) -> list[str]:
    """Every change against HEAD a build could pick up: modified, staged,
    deleted and untracked (not ignored) files, each listed."""
    return git("status", "--porcelain", "--untracked-files=all", cwd=root).splitlines()


def source_date_epoch(*paths: str) -> str:
    """SOURCE_DATE_EPOCH for what is built from `paths` (default: the
    engine's sources that go into its wheels): the time of the last commit
    that changed them. A commit elsewhere (the C++ tests included) then leaves
    the artifact's bytes as they were, so evidence made on another host from
    them (the GPU host's parity record) holds until their sources change."""
    pathspecs = paths or (*SOURCE_PATHS, *(f":(exclude){p}" for p in NOT_IN_WHEELS))
    return git("log", "-1", "--format=%ct", "--", *pathspecs) or git("log", "-1", "--format=%ct")


def engine_version(root: Path = ROOT) -> str:
    """The release's version: `release` of engine/pyproject.toml's version
    provider (packaging/build_support/engine_version.py). Each target's engine
    wheels carry it with the target's local label (Target.wheel_version)."""
    project = tomllib.loads((root / ENGINE / "pyproject.toml").read_text())
    (release,) = [e["release"] for e in project["tool"]["dynamic-metadata"] if e.get("field") == "version"]
    return release


def project_files(*pathspecs: str) -> list[str]:
    """The tracked and the untracked but not ignored files `pathspecs` name
    (what a build or a check of the working tree sees), relative to ROOT."""
    return git("ls-files", "--cached", "--others", "--exclude-standard", *pathspecs).splitlines()


def snapshot_source(dest: Path) -> list[str]:
    """Copy the tracked and not-ignored files of SOURCE_PATHS to dest, keeping
    their paths (the project is dest/engine); returns them."""
    files = [f for f in project_files(*SOURCE_PATHS) if (ROOT / f).is_file()]
    if dest.exists():
        shutil.rmtree(dest)
    for f in files:
        out = dest / f
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / f, out)
    return files
