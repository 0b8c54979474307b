"""verify-rebuild: rebuild a release's engine wheels independently and say,
wheel by wheel, whether the bytes are the published ones.

    python -m pipeline verify-rebuild MANIFEST [--repo URL] [--wheels DIR] [--target T]

The manifest's recorded commit is checked out in a fresh clone (of --repo,
default this checkout's repository) and the clone's own build stage runs
there: the commit's own recipe, release.toml pins and builder image
definition, a new builder container and an empty compiler cache. Each engine
wheel the manifest lists for the rebuilt targets is then compared by sha256:
MATCH, DIFFERS (and, when the published wheel is at hand with --wheels, the
entries inside it that differ) or MISSING. Any line but MATCH fails the
command. Check the manifest's signature with `verify` first: this command
compares against what the manifest records.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import zipfile
from pathlib import Path

from pipeline.container import echo_run
from pipeline.digest import sha256_of
from pipeline.errors import ConfigError, RebuildError
from pipeline.paths import ROOT, target_dir


def read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; give the release's activekv-<version>.manifest.json") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable manifest ({e.__class__.__name__}: {e})") from None
    if (
        not isinstance(manifest, dict)
        or not isinstance(manifest.get("commit"), str)
        or not isinstance(manifest.get("artifacts"), list)
    ):
        raise ConfigError(f"{path}: not an ActiveKV release manifest (no commit or artifacts)")
    return manifest


def rebuild(
    manifest_path: Path,
    *,
    repo: str | None = None,
    wheels: Path | None = None,
    targets: list[str] | None = None,
    work: Path | None = None,
    empty_compiler_cache: bool = True,
) -> list[str]:
    """Rebuild and compare; returns the report lines (also printed). Raises
    RebuildError when any wheel is not byte-identical or missing.
    empty_compiler_cache=False lets the clone's build use this host's compiler
    cache (a test of the report itself, where independence is not the claim)."""
    manifest = read_manifest(manifest_path)
    published = [a for a in manifest["artifacts"] if a.get("kind") == "engine-wheel"]
    chosen = targets or sorted({a["target"] for a in published})
    unknown = sorted(set(chosen) - {a["target"] for a in published})
    if unknown:
        raise ConfigError(
            f"--target {unknown[0]}: the manifest lists no engine wheel for it "
            f"(it has: {', '.join(sorted({a['target'] for a in published}))})"
        )
    if wheels is not None and not wheels.is_dir():
        raise ConfigError(f"--wheels {wheels}: not a folder; give the folder holding the published wheels")
    if manifest.get("tree_dirty"):
        print(
            f"warning: the release was made from a tree with uncommitted changes (tree_dirty): "
            f"commit {manifest['commit'][:12]} alone may not give its bytes",
            flush=True,
        )
    with tempfile.TemporaryDirectory(prefix="activekv-rebuild-", dir=work) as tmp:
        clone = Path(tmp) / "src"
        checkout(repo or str(ROOT), manifest["commit"], clone)
        lines = []
        # The clone's build keeps its caches in a new folder: nothing compiled
        # before is reused (ACTIVEKV_CACHE, pipeline/paths.py).
        caches = Path(tmp) / "cache" if empty_compiler_cache else None
        for target in chosen:
            built = build_in(clone, target, caches)
            lines += compare([a for a in published if a["target"] == target], built, wheels)
    for line in lines:
        print(line, flush=True)
    bad = [line for line in lines if not line.startswith("MATCH")]
    if bad:
        raise RebuildError(
            f"{len(bad)} of {len(lines)} wheel(s) are not what the rebuild of commit "
            f"{manifest['commit'][:12]} gives (listed above): the published bytes do not "
            f"come from that commit's recipe alone"
        )
    return lines


def checkout(repo: str, commit: str, dest: Path) -> None:
    _run(["git", "clone", "--quiet", "--no-local", "--no-checkout", repo, str(dest)], f"cloning {repo} failed")
    _run(
        ["git", "-C", str(dest), "checkout", "--quiet", "--detach", commit],
        f"commit {commit} is not in {repo}: give --repo a repository that has it",
    )


def build_in(clone: Path, target: str, caches: Path | None) -> list[Path]:
    """The clone's build stage for `target` (its caches in `caches`, or this
    host's); its repaired wheels."""
    env = None if caches is None else dict(os.environ, ACTIVEKV_CACHE=str(caches))
    _run(
        [sys.executable, "-m", "pipeline", "build", "--target", target],
        f"the clone's build stage for target {target} failed (its output is above)",
        cwd=clone,
        env=env,
    )
    return sorted((target_dir(target, root=clone) / "wheels").glob("*.whl"))


def compare(published: list[dict], built: list[Path], wheels: Path | None) -> list[str]:
    by_name = {w.name: w for w in built}
    lines = []
    for a in published:
        mine = by_name.pop(a["file"], None)
        if mine is None:
            lines.append(
                f"MISSING {a['file']}: the rebuild made no wheel of this name "
                f"(it made: {', '.join(w.name for w in built) or 'nothing'})"
            )
            continue
        have = sha256_of(mine)
        if have == a["sha256"]:
            lines.append(f"MATCH   {a['file']} sha256 {have}")
            continue
        line = f"DIFFERS {a['file']}: rebuilt sha256 {have}, published {a['sha256']}"
        theirs = wheels / a["file"] if wheels is not None else None
        if theirs is not None and theirs.is_file() and sha256_of(theirs) == a["sha256"]:
            line += "; entries that differ: " + ", ".join(differing_entries(mine, theirs))
        lines.append(line)
    lines += [f"EXTRA   {name}: rebuilt, but the manifest lists no such wheel" for name in sorted(by_name)]
    return lines


def differing_entries(a: Path, b: Path) -> list[str]:
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        names = sorted(set(za.namelist()) | set(zb.namelist()))
        return [n for n in names if n not in za.namelist() or n not in zb.namelist() or za.read(n) != zb.read(n)] or [
            "(zip metadata only)"
        ]


def _run(cmd: list[str], failure: str, *, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    if echo_run(cmd, check=False, cwd=cwd, env=env).returncode != 0:
        raise RebuildError(failure)
