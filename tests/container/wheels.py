"""Rewriting a wheel for the audit's rejection tests: one change at a time,
with RECORD made valid again, so each test breaks exactly one rule."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path


def record_row(name: str, data: bytes) -> tuple[str, str, str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return name, f"sha256={digest}", str(len(data))


def rewrite_wheel(
    src: Path, dest: Path, *, add: Mapping[str, bytes] = {}, edit: Mapping[str, Callable[[bytes], bytes]] = {}
) -> Path:
    """Copy `src` to `dest` with files added or edited; RECORD is rebuilt."""
    with zipfile.ZipFile(src) as zin:
        files = {n: zin.read(n) for n in zin.namelist() if not n.endswith("/")}
    record_name = next(n for n in files if n.endswith(".dist-info/RECORD"))
    for name, change in edit.items():
        files[name] = change(files[name])
    files.update(add)
    del files[record_name]
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(
        [record_row(n, d) for n, d in files.items()] + [(record_name, "", "")]
    )
    files[record_name] = text.getvalue().encode()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        for name, data in files.items():
            zout.writestr(name, data)
    return dest
