"""What one stage reads of another's output, read here so that no stage
imports another (the registry alone imports them all):

    audited_wheels     the wheels the payload audit passed (audit.json)
    patched_wheel_for  the patched vLLM wheel of a target (patch.json)
    gate_problem       why a parity record (parity.json) does not pass the gate
    inputs_digest      the runtime image's inputs digest: its label, which the
                       manifest stage recomputes from the files it publishes

What a stage reads is a plain file, never a symbolic link: a link can be
re-pointed after a check, and inside a container (the audit's load check, the
runtime image's build) it dangles. Each stage refuses one by name, before any
work, with its own error (refuse_links)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from pipeline.config import Target
from pipeline.digest import sha256_of
from pipeline.errors import PipelineError
from pipeline.parity.cells import expectation_problems
from pipeline.paths import VLLM_DIR, relative, target_dir


def refuse_links(paths: Iterable[Path], what: str, error: type[PipelineError]) -> list[Path]:
    """`paths` as a list; `error` naming the first that is a symbolic link."""
    paths = list(paths)
    for path in paths:
        if path.is_symlink():
            raise error(
                f"{path}: a symbolic link (to {os.readlink(path)}), not the {what} itself; "
                f"the release's stages read files, never links (a link can be re-pointed "
                f"after the check): put the file there and re-run"
            )
    return paths


def audited_wheels(target: Target) -> list[Path]:
    """The wheels the payload audit passed (what ships), not whatever lies in the folder."""
    record = target_dir(target.name) / "audit.json"
    if not record.is_file():
        raise PipelineError(f"{relative(record)}: missing; run the audit stage first")
    recorded = json.loads(record.read_text())
    if not recorded.get("passed"):
        raise PipelineError(f"target {target.name}: the payload audit did not pass; no runtime image")
    return refuse_links(
        [target_dir(target.name) / "wheels" / w["file"] for w in recorded["wheels"]], "audited wheel", PipelineError
    )


def patched_wheel_for(target: Target) -> Path:
    """The patched vLLM wheel of the target's distribution at the target's
    vllm_version (release.toml), as the patch-vllm stage recorded it."""
    folder = VLLM_DIR / f"{target.vllm_distribution}-{target.vllm_version}"
    record = folder / "patch.json"
    if not record.is_file():
        raise PipelineError(f"no patched vLLM for target {target.name} in {folder}: run the patch-vllm stage first")
    (wheel,) = refuse_links(
        [folder / json.loads(record.read_text())["patched"]["file"]], "patched vLLM wheel", PipelineError
    )
    return wheel


def gate_problem(record: dict) -> str:
    """Why a parity record does not pass the gate ('' when it does): at least
    one gating cell, every gating cell passed."""
    cells = record.get("cells")
    if not isinstance(cells, list) or not all(
        isinstance(c, dict) and {"mode", "scenario", "gating", "result"} <= c.keys() for c in cells
    ):
        return "the record has no readable cells"
    gating = [c for c in cells if c["gating"]]
    if not gating:
        return "no gating cell: nothing was proven"
    failed = [
        f"{c['mode']}/{c['scenario']}"
        for c in cells
        if c["result"] == "FAIL" or (c["gating"] and c["result"] != "pass")
    ]
    problems = [", ".join(failed)] if failed else []
    return "; ".join(problems + expectation_problems(cells))


def wheel_differences(ran: list, ships: list[dict]) -> list[str]:
    """How a parity record's wheels (`ran`) differ from those that ship, file
    by file ([] when they are the same, by name and sha256)."""
    ran_by = {w.get("file"): w.get("sha256") for w in ran if isinstance(w, dict)}
    ships_by = {w["file"]: w["sha256"] for w in ships}
    out = []
    for file in sorted(set(ran_by) | set(ships_by)):
        have, want = ran_by.get(file), ships_by.get(file)
        if have == want:
            continue
        if file not in ran_by:
            out.append(f"{file} (sha256 {want}) ships but did not run")
        elif file not in ships_by:
            out.append(f"{file} (sha256 {have}) ran but does not ship")
        else:
            out.append(f"{file} ran as sha256 {have}, ships as sha256 {want}")
    return out


def inputs_digest(version: str, commit: str, wheels: list[Path]) -> str:
    """sha256 over the version, the commit and each file's name and sha256
    (the wheels and the launcher)."""
    h = hashlib.sha256(f"{version}\n{commit}\n".encode())
    for w in sorted(wheels, key=lambda p: p.name):
        h.update(f"{w.name} {sha256_of(w)}\n".encode())
    return "sha256:" + h.hexdigest()
