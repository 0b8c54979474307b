"""Stage: audit. The payload audit of each target's wheels (pipeline/audit/
says what it guarantees and where each rule lives); fails closed.

Writes build/release/<target>/audit.json, which the later stages read: the
wheels that passed, by hash, and whether the load check ran. --static-only
skips it, and the manifest stage refuses such an audit.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pipeline.artifacts import refuse_links
from pipeline.audit.load_check import load_check
from pipeline.audit.policy import load_policy
from pipeline.audit.static import audit_wheel
from pipeline.audit.wheel import Finding
from pipeline.config import Target
from pipeline.container import ContainerRuntime
from pipeline.digest import sha256_of
from pipeline.errors import AuditError
from pipeline.paths import target_dir
from pipeline.run import Run


def audit(runtime: ContainerRuntime | None, target: Target, wheels_dir: Path, report: Path) -> dict:
    """Audit every wheel in wheels_dir; write the report; raise AuditError on
    any finding. runtime=None skips the load check (static rules only)."""
    policy = load_policy()
    wheels = refuse_links(sorted(wheels_dir.glob("*.whl")), "wheel", AuditError)
    findings: list[Finding] = []
    if not wheels:
        findings.append(
            Finding(
                wheel="-", file=str(wheels_dir), rule="wheels", message="no wheel to audit: run the build stage first"
            )
        )
    for wheel in wheels:
        findings += audit_wheel(wheel, target, policy)
    runtime_image = None
    if runtime is not None and wheels and not findings:
        runtime_image, loaded = load_check(runtime, target, wheels)
        findings += loaded
    listed = []
    for w in wheels:
        try:
            listed.append({"file": w.name, "sha256": sha256_of(w), "size": w.stat().st_size})
        except OSError:  # its finding ("format") says so
            listed.append({"file": w.name, "sha256": None, "size": None})
    record = {
        "stage": "audit",
        "target": target.name,
        "passed": not findings,
        "load_checked": runtime_image is not None,
        "runtime_image": runtime_image,
        "wheels": listed,
        "findings": [dataclasses.asdict(f) for f in findings],
    }
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(record, indent=2) + "\n")
    if findings:
        raise AuditError(
            f"payload audit of target {target.name} failed ({len(findings)} finding(s); "
            f"report: {report}):\n" + "\n".join(f"  {f}" for f in findings)
        )
    return record


def execute(run: Run) -> None:
    static_only = run.options.static_only
    for target in run.targets:
        out = target_dir(target.name)
        audit(None if static_only else run.runtime, target, out / "wheels", out / "audit.json")
        run.say(
            f"{target.name}: payload audit passed ({out / 'audit.json'})"
            + (" (static rules only: the manifest stage will refuse this audit)" if static_only else "")
        )
