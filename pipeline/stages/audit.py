"""Stage: audit. The payload audit of a target's wheels; fails closed.

A wheel's contents are an allowlist (packaging/payload-policy.toml): the
extension module the engine build installs at the wheel's root, the files the
build writes into <distribution>-<version>.dist-info/, and libraries
auditwheel grafted into <distribution>.libs/ where the policy names the
library and a module of the wheel needs it by the name auditwheel gave it.
Every other entry is refused. Each finding names the wheel, the entry and the
rule it breaks:
- duplicate: a name the zip holds twice (the installer writes both, the last
  wins, and the audit could not say which it read);
- path: an entry whose path leaves the install directory or is not a plain
  relative POSIX path (absolute, `..`, backslash, drive letter, empty or `.`
  component, control character), or lies in a <distribution>.data/ folder
  (it installs into scripts, headers, data or beside the package);
- special-file: a symlink or other non-regular entry (zip external_attr);
- shadows: a top-level module, package or .pth file that Python imports at
  start-up or that shadows the standard library (sitecustomize, site,
  encodings, json, ...: sys.stdlib_module_names and the policy's startup);
- no-python: Python source or bytecode (the product is compiled);
- foreign-library: a shared library (by name or by ELF content) that is not
  our extension module nor a grafted library the policy names and a module
  needs (a copy of libc.so.6 at the root, a libfoo.so beside the module);
- not-ours: any other entry outside the allowlist (another package, another
  distribution's metadata, a file the build does not write);
- missing: METADATA, WHEEL, RECORD or the extension module is absent;
- format: not a readable zip, or an entry that does not read back;
- elf: a library we ship is not a whole ELF shared object for the target's
  machine (truncated, not ELF, another class or machine, unparseable);
- tags: the wheel's tags are the configured Python and platform tags;
- metadata: METADATA and WHEEL parse cleanly and name our distribution and
  the file name's version; torch-pin: METADATA pins torch== the target's torch;
- entry-point: entry_points.txt declares exactly the vllm.general_plugins
  entry point (a console script would install outside site-packages);
- sbom: auditwheel's SBOM, where present, is auditwheel's CycloneDX JSON;
- record: RECORD lists every file with a valid hash and size, once;
- linking (needed, rpath): every NEEDED library is in the wheel, a system
  library, or provided by the target's torch; no RPATH/RUNPATH leads outside
  the wheel or torch;
- size: at most the target's max_wheel_bytes;
- loading: in a container of the target's runtime base, `import torch` then
  `import activekv` (an ABI mismatch shows here without any accelerator).
Bad input gives findings, never a traceback: the audit raises AuditError (with
every finding) or ConfigError (an unreadable policy). Writes
build/release/<target>/audit.json, the record the manifest uses.
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
        findings.append(Finding(wheel="-", file=str(wheels_dir), rule="wheels",
                                message="no wheel to audit: run the build stage first"))
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
        raise AuditError(f"payload audit of target {target.name} failed ({len(findings)} finding(s); "
                         f"report: {report}):\n" + "\n".join(f"  {f}" for f in findings))
    return record


def execute(run: Run) -> None:
    static_only = run.options.static_only
    for target in run.targets:
        out = target_dir(target.name)
        audit(None if static_only else run.runtime, target, out / "wheels", out / "audit.json")
        run.say(f"{target.name}: payload audit passed ({out / 'audit.json'})"
                + (" (static rules only: the manifest stage will refuse this audit)" if static_only else ""))
