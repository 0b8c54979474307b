"""`python -m pipeline.parity`: record, replay, judge; exit 1 on a failed gating cell.

    python -m pipeline.parity --out build/parity [--modes exact compressed] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from ..harness import vllm_harness as h
from ..harness.tiny_model import tiny_llama
from ..paths import PARITY_DIR, TEST_CACHE
from . import e2e
from .cells import Cell, expectation_problems, judge, table
from .replay import ReplayResult, replay
from .trace import read_traces
from .workloads import full_graph_cell, record_session, sessions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.parity")
    parser.add_argument("--out", type=Path, default=PARITY_DIR)
    parser.add_argument("--modes", nargs="+", default=["exact", "compressed"],
                        choices=["exact", "compressed"])
    parser.add_argument("--cache", type=Path, default=TEST_CACHE)
    parser.add_argument("--device", default="cpu",
                        help="where the replays' KV caches live: the target's device (cpu, cuda); "
                             "the recordings and end-to-end cells run on the device vLLM runs on")
    args = parser.parse_args(argv)

    h.reference_on_path()
    model = tiny_llama(args.cache)
    cells: list[Cell] = []
    overhead: list[tuple[str, ReplayResult, ReplayResult]] = []
    for mode in args.modes:
        for session in sessions(mode):
            directory = args.out / "recordings" / f"{mode}-{session.name}"
            shutil.rmtree(directory, ignore_errors=True)
            record_session(tiny_llama(args.cache, session.num_layers), session, directory)
            sched, worker = read_traces(directory)
            runs = [replay(sched, worker, impl, device=args.device)
                    for impl in ("reference", "reference", "native")]
            # Steps under a full CUDA graph (no per-layer hook): each engine
            # must observe what the reference did with the hooks. Streaming
            # has vLLM capture piecewise graphs only.
            graph_runs = [] if session.streams else [
                replay(sched, worker, impl, layer_hooks=False, device=args.device)
                for impl in ("reference", "native")]
            for scenario, _ in session.scenarios:
                ref1, ref2, native = (r.observations.get(scenario, []) for r in runs)
                live = runs[0].live_differs.get(scenario, 0)
                cells.append(judge(mode, scenario, ref1, ref2, native, live))
                if graph_runs:
                    ref_graph, native_graph = (r.observations.get(scenario, []) for r in graph_runs)
                    cells.append(judge(mode, full_graph_cell(scenario), ref1, ref_graph,
                                       native_graph, live))
            overhead.append((f"{mode}-{session.name}", runs[1], runs[2]))
        cells.append(e2e.run(model, mode))
    print(table(cells))
    print("\nper-step connector time on the same recordings (inside connector calls only; "
          "per-layer calls as vLLM with the patch series makes them):")
    print(f"  {'recording':24}{'steps':>6}  {'all steps: reference / native':>32}"
          f"  {'steps moving no block: reference / native':>44}")
    def ratio(a: float, b: float) -> str:
        return f"{a / b:4.1f}x" if b else "   -"

    for name, ref, nat in overhead:
        # A streaming step always moves blocks (it stages): none moves nothing.
        print(f"  {name:24}{ref.steps:6}  {ref.per_step_us():9.1f} / {nat.per_step_us():6.1f} us"
              f" ({ratio(ref.per_step_us(), nat.per_step_us())})"
              f"  {ref.control_steps:6} steps {ref.control_step_us():7.1f} / "
              f"{nat.control_step_us():5.1f} us ({ratio(ref.control_step_us(), nat.control_step_us())})")
    report = args.out / "parity.json"
    report.write_text(json.dumps({
        "cells": [c.as_dict() for c in cells],
        "overhead_us_per_step": [
            {"recording": n, "steps": r.steps, "reference": r.per_step_us(),
             "native": x.per_step_us(), "steps_moving_no_block": r.control_steps,
             "reference_no_block": r.control_step_us(), "native_no_block": x.control_step_us()}
            for n, r, x in overhead
        ],
    }, indent=2))
    print(f"\nwrote {report}")
    failed = [c for c in cells if c.result == "FAIL"]
    problems = expectation_problems([c.as_dict() for c in cells], modes=args.modes)
    for problem in problems:
        print(f"parity: {problem}", file=sys.stderr)
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
