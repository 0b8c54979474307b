"""`python -m pipeline.parity`: record, replay, judge; exit 1 on a failed gating cell.

    python -m pipeline.parity --out build/parity [--modes exact compressed] [--device cuda] [--resume] [--jobs N]

The work is done in units: each session (recorded in one vLLM, replayed by
both engines, judged) and each mode's end-to-end cell. A unit's result is
kept in OUT/units/ with the fingerprint of what made it (the engine's and
vLLM's installed bytes, by their RECORD; the reference's and the harness's
sources; the device); --resume takes a unit whose fingerprint matches instead
of running it again: a release run again on the same wheels, or a GPU host
whose commands may run only so long, where each vLLM start costs 40 s.
parity.json says which units ran and which were kept.

--jobs N runs N units at once, each in a process of its own (a GPU host with
cores and GPU memory to spare: most of a unit is vLLM starting); the record
is the one a run of one job writes.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import queue
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, NamedTuple

from ..vllm_driver import llm as h
from ..vllm_driver.tiny_model import tiny_llama
from ..paths import PARITY_DIR, REFERENCE_DIR, ROOT, TEST_CACHE
from . import e2e
from .cells import Cell, expectation_problems, judge, table
from .replay import replay
from .trace import read_traces
from .workloads import Session, full_graph_cell, record_session, sessions

# What a unit's result depends on besides the engine's module and vLLM.
SOURCES = [REFERENCE_DIR, ROOT / "pipeline" / "parity", ROOT / "pipeline" / "vllm_driver"]


def installed_bytes(module) -> bytes:
    """What identifies an installed package's bytes: its distribution's RECORD
    (every file's sha256, as installed from its wheel), else the module file."""
    import importlib.metadata as md

    for name in md.packages_distributions().get(module.__name__, []):
        try:
            record = md.distribution(name).read_text("RECORD")
        except md.PackageNotFoundError:
            continue
        if record:
            return record.encode()
    return Path(module.__file__).read_bytes()


def fingerprint(device: str) -> str:
    """The engine's and vLLM's installed bytes, the reference's and harness's
    sources and the device: a unit made under another is run again."""
    import activekv
    import vllm

    digest = hashlib.sha256()
    for module in (activekv, vllm):
        digest.update(installed_bytes(module) + b"\0")
    for root in SOURCES:
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    digest.update(f"vllm {vllm.__version__} device {device}".encode())
    return digest.hexdigest()


def kept_unit(out: Path, name: str, mark: str) -> dict | None:
    """The unit's result an earlier run left in OUT/units, if the same bytes made it."""
    path = out / "units" / f"{name}.json"
    if not path.is_file():
        return None
    kept = json.loads(path.read_text())
    return kept if kept.get("fingerprint") == mark else None


def unit(out: Path, name: str, label: str, resume: bool, mark: str, run) -> dict:
    """A unit's result ({"cells": [...], "overhead": ...}): kept from an earlier
    run under the same fingerprint (`mark`) with --resume, else run and kept."""
    path = out / "units" / f"{name}.json"
    kept = kept_unit(out, name, mark) if resume else None
    if kept is not None:
        print(f"parity: {label}: kept ({path.parent.name}/{path.name}, same fingerprint)", flush=True)
        return {**kept, "kept": True}
    result = {"fingerprint": mark, **run()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return {**result, "kept": False}


@contextlib.contextmanager
def phase(what: str):
    """Prints how long `what` took: on a GPU host a unit's time is the
    figure that decides how many fit in one command."""
    start = time.monotonic()
    yield
    print(f"parity: {what} in {time.monotonic() - start:.1f} s", flush=True)


def end_to_end_unit(model: Path, mode: str) -> dict:
    return {"cells": [e2e.run(model, mode).as_dict()]}


def session_unit(args, mode: str, session: Session) -> dict:
    name = f"{mode}-{session.name}"
    directory = args.out / "recordings" / name
    shutil.rmtree(directory, ignore_errors=True)
    with phase(f"{name}: recorded in vLLM"):
        record_session(tiny_llama(args.cache, session.num_layers), session, directory)
    sched, worker = read_traces(directory)

    def timed_replay(impl: str, layer_hooks: bool = True):
        hooks = "" if layer_hooks else " without per-layer hooks"
        start = time.monotonic()
        result = replay(sched, worker, impl, layer_hooks=layer_hooks, device=args.device)
        # The rest is the harness's: the recorded blocks put back, each
        # observation's digest (on a GPU, copies to the host).
        print(
            f"parity: {name}: replayed on the {impl} engine{hooks} in {time.monotonic() - start:.1f} s"
            f" ({result.connector_seconds:.1f} s in its calls)",
            flush=True,
        )
        return result

    runs = [timed_replay(impl) for impl in ("reference", "reference", "native")]
    # Steps under a full CUDA graph (no per-layer hook): each engine must
    # observe what the reference did with the hooks. Streaming has vLLM
    # capture piecewise graphs only.
    graph_runs = [] if session.streams else [timed_replay(impl, False) for impl in ("reference", "native")]
    cells = []
    for scenario, _ in session.scenarios:
        ref1, ref2, native = (r.observations.get(scenario, []) for r in runs)
        live = runs[0].live_differs.get(scenario, 0)
        cells.append(judge(mode, scenario, ref1, ref2, native, live))
        if graph_runs:
            ref_graph, native_graph = (r.observations.get(scenario, []) for r in graph_runs)
            cells.append(judge(mode, full_graph_cell(scenario), ref1, ref_graph, native_graph, live))
    ref, nat = runs[1], runs[2]
    overhead = {
        "recording": f"{mode}-{session.name}",
        "steps": ref.steps,
        "reference": ref.per_step_us(),
        "native": nat.per_step_us(),
        "steps_moving_no_block": ref.control_steps,
        "reference_no_block": ref.control_step_us(),
        "native_no_block": nat.control_step_us(),
    }
    return {"cells": [c.as_dict() for c in cells], "overhead": overhead}


def run_in_jobs(args, names: list[str]) -> None:
    """Each unit in a process of its own (`--units NAME`), `args.jobs` at a
    time; each job's output goes to OUT/jobs/NAME.log. A unit that failed
    in its job is left for the caller's own run, where its error shows."""
    logs = args.out / "jobs"
    logs.mkdir(parents=True, exist_ok=True)
    # A compile cache per slot: jobs of the same shapes must not write one
    # cache at once; a slot's later units reuse what its first compiled.
    slots: queue.Queue[int] = queue.Queue()
    for slot in range(args.jobs):
        slots.put(slot)
    common = ["--out", str(args.out), "--cache", str(args.cache), "--device", args.device, "--modes", *args.modes]
    # The jobs share the host's cores: each sized for all of them, their
    # threads would take turns (their vLLM starts, under one lock, the most).
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // args.jobs))

    def job(name: str) -> None:
        slot = slots.get()
        start = time.monotonic()
        try:
            env = dict(
                os.environ,
                VLLM_CACHE_ROOT=str(args.out / "jobs" / f"vllm-cache-{slot}"),
                OMP_NUM_THREADS=threads,
                **{h.START_LOCK_ENV: str(logs / "vllm-start.lock")},  # one vLLM starts or stops at a time
            )
            command = [sys.executable, "-m", "pipeline.parity", *common, "--units", name]
            with (logs / f"{name}.log").open("w") as log:
                code = subprocess.run(
                    command + (["--resume"] if args.resume else []), stdout=log, stderr=subprocess.STDOUT, env=env
                ).returncode
            outcome = "done" if code == 0 else f"FAILED (exit {code}; {logs.name}/{name}.log)"
            print(f"parity: job {name}: {outcome} in {time.monotonic() - start:.0f} s", flush=True)
        finally:
            slots.put(slot)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(job, names))


class Unit(NamedTuple):
    name: str
    label: str
    run: Callable[[], dict]
    vllm_starts: int  # what a unit's time is mostly made of on a GPU host
    streams: bool  # a streaming session: many layers, the longest replays


def units_plan(args) -> list[Unit]:
    """Every unit. Each session records on a model of its own depth, made
    here once, before any job needs it."""
    model = tiny_llama(args.cache)
    plan: list[Unit] = []
    for mode in args.modes:
        for session in sessions(mode):
            tiny_llama(args.cache, session.num_layers)
            run = functools.partial(session_unit, args, mode, session)
            plan.append(Unit(f"{mode}-{session.name}", f"{mode} session {session.name}", run, 1, session.streams))
        run = functools.partial(end_to_end_unit, model, mode)
        plan.append(Unit(f"{mode}-end-to-end", f"{mode} end to end", run, e2e.VLLM_STARTS, False))
    return plan


def longest_first(units: list[Unit]) -> list[str]:
    """The jobs' order: the longest units first (streaming sessions, then
    those that start vLLM most often), so that the last job to end is a
    short one and a command of bounded length ends whole units."""
    return [u.name for u in sorted(units, key=lambda u: (not u.streams, -u.vllm_starts))]


def print_overhead(overhead: list[dict]) -> None:
    print(
        "\nper-step connector time on the same recordings (inside connector calls only; "
        "per-layer calls as vLLM with the patch series makes them):"
    )
    print(
        f"  {'recording':24}{'steps':>6}  {'all steps: reference / native':>32}"
        f"  {'steps moving no block: reference / native':>44}"
    )

    def ratio(a: float, b: float) -> str:
        return f"{a / b:4.1f}x" if b else "   -"

    for o in overhead:
        # A streaming step always moves blocks (it stages): none moves nothing.
        print(
            f"  {o['recording']:24}{o['steps']:6}  {o['reference']:9.1f} / {o['native']:6.1f} us"
            f" ({ratio(o['reference'], o['native'])})"
            f"  {o['steps_moving_no_block']:6} steps {o['reference_no_block']:7.1f} / "
            f"{o['native_no_block']:5.1f} us ({ratio(o['reference_no_block'], o['native_no_block'])})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.parity")
    parser.add_argument("--out", type=Path, default=PARITY_DIR)
    parser.add_argument("--modes", nargs="+", default=["exact", "compressed"], choices=["exact", "compressed"])
    parser.add_argument("--cache", type=Path, default=TEST_CACHE)
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the replays' KV caches live: the target's device (cpu, cuda); "
        "the recordings and end-to-end cells run on the device vLLM runs on",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the units an earlier run left in OUT/units under the same fingerprint",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="units run at once, each in a process of its own (default 1)"
    )
    parser.add_argument("--units", nargs="+", help=argparse.SUPPRESS)  # a job's share: these units, no record
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more")

    h.reference_on_path()
    plan = units_plan(args)
    mark = fingerprint(args.device)
    if args.units:
        unknown = set(args.units) - {u.name for u in plan}
        if unknown:
            parser.error(f"--units: no such unit {sorted(unknown)} (units: {', '.join(u.name for u in plan)})")
        for u in plan:
            if u.name in args.units:
                unit(args.out, u.name, u.label, args.resume, mark, u.run)
        return 0
    kept_before: set[str] = set()
    if args.jobs > 1:
        if args.resume:
            kept_before = {u.name for u in plan if kept_unit(args.out, u.name, mark) is not None}
        else:  # the jobs' units are this run's: none from before may be kept
            shutil.rmtree(args.out / "units", ignore_errors=True)
        run_in_jobs(args, longest_first([u for u in plan if u.name not in kept_before]))
    cells: list[dict] = []
    overhead: list[dict] = []
    units: dict[str, str] = {}
    for name, label, run, _, _ in plan:
        # After the jobs, each unit is kept from its job (one that failed there runs here).
        done = unit(args.out, name, label, args.resume or args.jobs > 1, mark, run)
        cells += done["cells"]
        if "overhead" in done:
            overhead.append(done["overhead"])
        kept = name in kept_before if args.jobs > 1 else done["kept"]
        units[name] = "kept" if kept else "ran"
    print(table([Cell(**c) for c in cells]))
    print_overhead(overhead)
    report = args.out / "parity.json"
    report.write_text(
        json.dumps({"fingerprint": mark, "units": units, "cells": cells, "overhead_us_per_step": overhead}, indent=2)
    )
    print(f"\nwrote {report}")
    failed = [c for c in cells if c["result"] == "FAIL"]
    problems = expectation_problems(cells, modes=args.modes)
    for problem in problems:
        print(f"parity: {problem}", file=sys.stderr)
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
