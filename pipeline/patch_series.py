"""A vLLM patch series as it lies in patches/vllm/<version>/: the `series`
file naming the patches in order with the local-version label, and what each
patch touches and adds.

Read by the patch-vllm stage (which applies it), the retention audit
(pipeline/boundary.py, which labels every hunk) and the tests: reading a
series needs none of the stage's machinery.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

from pipeline.errors import PatchError
from pipeline.paths import ROOT, relative

PATCHES_DIR = ROOT / "patches" / "vllm"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Series:
    version: str
    directory: Path
    patches: tuple[Path, ...]
    local_version: str  # e.g. activekv.1

    def combined(self) -> str:
        return "".join(p.read_text() for p in self.patches)

    def sha256(self) -> str:
        return hashlib.sha256(self.combined().encode()).hexdigest()


def supported_versions(patches_dir: Path = PATCHES_DIR) -> list[str]:
    found = [d.name for d in patches_dir.iterdir() if (d / "series").is_file()] if patches_dir.is_dir() else []
    return sorted(found, key=Version)


def nearest_version(version: str, supported: list[str]) -> str | None:
    """The newest supported version not after `version`, else the oldest."""
    if not supported:
        return None
    try:
        wanted = Version(version)
    except InvalidVersion:
        return supported[-1]
    earlier = [v for v in supported if Version(v) <= wanted]
    return earlier[-1] if earlier else supported[0]


def load_series(version: str, patches_dir: Path = PATCHES_DIR) -> Series:
    directory = patches_dir / version
    series_file = directory / "series"
    if not series_file.is_file():
        supported = supported_versions(patches_dir)
        near = nearest_version(version, supported)
        raise PatchError(
            f"vLLM {version} is not supported: no patch series at "
            f"{relative(directory)}. "
            f"Supported versions: {', '.join(supported) or 'none'}. Nearest series: {near}; "
            f"try it with `python -m pipeline patch-vllm --vllm {version} --rebase`"
        )
    names, label = [], None
    for line in series_file.read_text().splitlines():
        line = line.strip()
        if m := re.match(r"#\s*local-version:\s*(\S+)", line):
            label = m.group(1)
        elif line and not line.startswith("#"):
            names.append(line)
    if label is None or not re.fullmatch(r"activekv\.\d+", label):
        raise PatchError(f"{series_file}: needs a '# local-version: activekv.N' line")
    patches = []
    for name in names:
        path = directory / name
        if not path.is_file():
            raise PatchError(f"{series_file}: names {name}, which is not in {directory.name}/")
        patches.append(path)
    if not patches:
        raise PatchError(f"{series_file}: names no patch")
    return Series(version=version, directory=directory, patches=tuple(patches), local_version=label)


def touched_files(patch: Path) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", patch.read_text(), re.MULTILINE)]


def added_blocks(patch: Path) -> list[tuple[str, int, str]]:
    """(file, hunk number within the file, a run of consecutive added lines as
    the patched file holds them) for each run of each hunk. A later patch may
    add lines next to an earlier one's, but never inside one of its runs."""
    out: list[tuple[str, int, str]] = []
    current, index, added = None, 0, []

    def flush() -> None:
        if added:
            out.append((current, index, "".join(added)))
            added.clear()

    for line in patch.read_text().splitlines(keepends=True):
        if line.startswith("+++ b/"):
            flush()
            current, index = line[6:].strip(), 0
        elif line.startswith("@@ ") and current is not None:
            flush()
            index += 1
        elif index and line.startswith("+"):
            added.append(line[1:])
        else:
            flush()
    flush()
    return out
