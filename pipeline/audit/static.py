"""The static rules on one wheel file: everything the audit checks without
installing it. The order is the order of the findings."""

from __future__ import annotations

import zipfile
from pathlib import Path

from pipeline.audit import elf, entries, metadata
from pipeline.audit.policy import Policy
from pipeline.audit.wheel import Finding, Wheel
from pipeline.config import Target


def audit_wheel(path: Path, target: Target, policy: Policy) -> list[Finding]:
    wheel = Wheel(path, target, policy)
    try:
        size = path.stat().st_size
        zf = zipfile.ZipFile(path)
    except (*entries.ZIP_READ_ERRORS, zipfile.LargeZipFile) as e:
        wheel.fail(path.name, "format", f"not a readable zip archive ({e})")
        return wheel.findings
    if size > target.max_wheel_bytes:
        wheel.fail(
            path.name,
            "size",
            f"{size} bytes exceeds max_wheel_bytes={target.max_wheel_bytes} of target {target.name} (release.toml)",
        )
    with zf:
        present, regular = entries.screen(wheel, zf)
        files = entries.read(wheel, zf, regular)
        kinds = {name: entries.classify(wheel, name, data) for name, data in files.items()}
        entries.required(wheel, present)
        metadata.tags(wheel, files.get(f"{wheel.dist_info}/WHEEL"))
        metadata.metadata(wheel, files)
        metadata.sbom(wheel, files.get(f"{wheel.dist_info}/sboms/auditwheel.cdx.json"))
        if f"{wheel.dist_info}/RECORD" in files:
            metadata.record(wheel, files, present)
        libraries = {n: elf.read_elf(wheel, n, files[n]) for n, k in kinds.items() if k in ("module", "grafted")}
        readable = {n: e for n, e in libraries.items() if e is not None}
        elf.linking(wheel, readable, [n for n, k in kinds.items() if k == "grafted"], present)
        elf.symbol_versions(wheel, readable)
    return wheel.findings
