"""`python -m pipeline.parity`: record, replay, judge; exit 1 on a failed gating cell.

    python -m pipeline.parity --out build/parity [--modes exact compressed]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from .. import vllm_harness as h
from ..tiny_model import tiny_llama
from .cells import Cell, judge, table
from .replay import replay
from .trace import read_trace
from .workloads import record_session, sessions


def _traces(directory: Path) -> tuple[list[dict], list[dict]]:
    sched = sorted(directory.glob("scheduler-*.trace"))
    workers = sorted(directory.glob("worker-*.trace"))
    if len(sched) != 1 or len(workers) != 1:
        raise SystemExit(f"{directory}: expected one scheduler and one worker trace, "
                         f"found {len(sched)} and {len(workers)}")
    return read_trace(sched[0]), read_trace(workers[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.parity")
    parser.add_argument("--out", type=Path, default=Path("build/parity"))
    parser.add_argument("--modes", nargs="+", default=["exact", "compressed"],
                        choices=["exact", "compressed"])
    parser.add_argument("--cache", type=Path, default=Path(".cache/tests"))
    args = parser.parse_args(argv)

    h.reference_on_path()
    model = tiny_llama(args.cache)
    cells: list[Cell] = []
    overhead: list[tuple[str, int, float, float]] = []
    for mode in args.modes:
        for session in sessions(mode):
            directory = args.out / "recordings" / f"{mode}-{session.name}"
            shutil.rmtree(directory, ignore_errors=True)
            record_session(model, session, directory)
            sched, worker = _traces(directory)
            runs = [replay(sched, worker, impl) for impl in ("reference", "reference", "native")]
            for scenario, _ in session.scenarios:
                ref1, ref2, native = (r.observations.get(scenario, []) for r in runs)
                cells.append(judge(mode, scenario, ref1, ref2, native,
                                   runs[0].live_differs.get(scenario, 0)))
            overhead.append((f"{mode}-{session.name}", runs[0].steps, runs[1].per_step_us(),
                             runs[2].per_step_us()))
    print(table(cells))
    print("\nper-step connector overhead on the same recordings (time inside connector calls):")
    for name, steps, ref_us, native_us in overhead:
        print(f"  {name:22} {steps:5} steps  reference {ref_us:9.1f} us  native {native_us:8.1f} us"
              f"  ({ref_us / native_us:5.1f}x less)")
    report = args.out / "parity.json"
    report.write_text(json.dumps({
        "cells": [c.as_dict() for c in cells],
        "overhead_us_per_step": [
            {"recording": n, "steps": s, "reference": r, "native": x} for n, s, r, x in overhead
        ],
    }, indent=2))
    print(f"\nwrote {report}")
    failed = [c for c in cells if c.result == "FAIL"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
