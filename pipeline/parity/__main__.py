"""`python -m pipeline.parity`: record, replay, judge; exit 1 on a failed gating cell.

    python -m pipeline.parity --out build/parity [--modes exact compressed] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..harness import vllm_harness as h
from ..harness.tiny_model import tiny_llama
from ..paths import PARITY_DIR, TEST_CACHE
from . import e2e
from .cells import Cell, expectation_problems, judge, table
from .replay import ReplayResult, replay
from .trace import read_traces
from .workloads import record_session, sessions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.parity")
    parser.add_argument("--out", type=Path, default=PARITY_DIR)
    parser.add_argument("--modes", nargs="+", default=["exact", "compressed"],
                        choices=["exact", "compressed"])
    parser.add_argument("--cache", type=Path, default=TEST_CACHE)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="modes run side by side, each in its own process on its own core "
                             "(default: one per core)")
    args = parser.parse_args(argv)

    tiny_llama(args.cache)  # made once, before any child looks for it
    if args.jobs > 1 and len(args.modes) > 1:
        cells, overhead = run_modes_side_by_side(args)
    else:
        cells, overhead = [], []
        for mode in args.modes:
            mode_cells, mode_overhead = run_mode(mode, args)
            cells += mode_cells
            overhead += mode_overhead
    print(table([Cell(**c) for c in cells]))
    print("\nper-step connector time on the same recordings (inside connector calls only; "
          "per-layer calls as vLLM with the patch series makes them):")
    print(f"  {'recording':24}{'steps':>6}  {'all steps: reference / native':>32}"
          f"  {'steps moving no block: reference / native':>44}")

    def ratio(a: float, b: float) -> str:
        return f"{a / b:4.1f}x" if b else "   -"

    for o in overhead:
        # A streaming step always moves blocks (it stages): none moves nothing.
        print(f"  {o['recording']:24}{o['steps']:6}  {o['reference']:9.1f} / {o['native']:6.1f} us"
              f" ({ratio(o['reference'], o['native'])})"
              f"  {o['steps_moving_no_block']:6} steps {o['reference_no_block']:7.1f} / "
              f"{o['native_no_block']:5.1f} us ({ratio(o['reference_no_block'], o['native_no_block'])})")
    report = write_report(args.out, cells, overhead)
    print(f"\nwrote {report}")
    failed = [c for c in cells if c["result"] == "FAIL"]
    problems = expectation_problems(cells)
    for problem in problems:
        print(f"parity: {problem}", file=sys.stderr)
    return 1 if failed or problems else 0


def run_mode(mode: str, args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """One mode's cells (its recordings replayed, then its end-to-end cell) and
    the connector time per step of its recordings."""
    h.reference_on_path()
    cells: list[Cell] = []
    overhead = []
    for session in sessions(mode):
        directory = args.out / "recordings" / f"{mode}-{session.name}"
        shutil.rmtree(directory, ignore_errors=True)
        record_session(tiny_llama(args.cache, session.num_layers), session, directory)
        sched, worker = read_traces(directory)
        runs = [replay(sched, worker, impl) for impl in ("reference", "reference", "native")]
        for scenario, _ in session.scenarios:
            ref1, ref2, native = (r.observations.get(scenario, []) for r in runs)
            cells.append(judge(mode, scenario, ref1, ref2, native, runs[0].live_differs.get(scenario, 0)))
        overhead.append(step_times(f"{mode}-{session.name}", runs[1], runs[2]))
    cells.append(e2e.run(tiny_llama(args.cache), mode))
    return [c.as_dict() for c in cells], overhead


def step_times(name: str, ref: ReplayResult, nat: ReplayResult) -> dict:
    return {"recording": name, "steps": ref.steps, "reference": ref.per_step_us(),
            "native": nat.per_step_us(), "steps_moving_no_block": ref.control_steps,
            "reference_no_block": ref.control_step_us(), "native_no_block": nat.control_step_us()}


def write_report(out: Path, cells: list[dict], overhead: list[dict]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    report = out / "parity.json"
    report.write_text(json.dumps({"cells": cells, "overhead_us_per_step": overhead}, indent=2))
    return report


def run_modes_side_by_side(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """Each mode in a child process of its own (the modes share nothing; each
    keeps about one core busy), its vLLM's OpenMP threads bound to one core
    where there are enough; the cells merged in the modes' order. A child's
    output goes to its folder's harness.log, printed when it ends."""
    cores = sorted(os.sched_getaffinity(0))
    children = []
    for i, mode in enumerate(args.modes):
        folder = args.out / "modes" / mode
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        env = dict(os.environ)
        if len(cores) >= len(args.modes):
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(cores[i])
        log = (folder / "harness.log").open("wb")
        children.append((mode, folder, log, subprocess.Popen(
            [sys.executable, "-m", "pipeline.parity", "--modes", mode, "--out", str(folder),
             "--cache", str(args.cache), "--jobs", "1"], stdout=log, stderr=subprocess.STDOUT, env=env)))
    cells, overhead = [], []
    for mode, folder, log, child in children:
        child.wait()
        log.close()
        print(f"--- parity harness, mode {mode} (exit {child.returncode}):")
        print((folder / "harness.log").read_text(errors="replace"), end="", flush=True)
        report = folder / "parity.json"
        if not report.is_file():
            raise SystemExit(f"parity: the {mode} mode's run wrote no {report} (exit {child.returncode}; "
                             f"its output is above)")
        data = json.loads(report.read_text())
        cells += data["cells"]
        overhead += data["overhead_us_per_step"]
    return cells, overhead


if __name__ == "__main__":
    sys.exit(main())
