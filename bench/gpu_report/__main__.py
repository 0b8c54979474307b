"""python -m bench.gpu_report: see the package's docstring."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __doc__ as DOC
from .goals import goals
from .results import BadRun, read_results
from .tables import arc_table, compressed_table, curve_table, grid_table, plot_curve, trace_summary


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_report", description=DOC, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "raw",
        type=Path,
        nargs="+",
        help="streaming_bench outputs (RESULT lines are read); with --goals also gpu_vllm's JSON",
    )
    parser.add_argument("--plot", type=Path, help="write the resident-layers curve as a PNG here")
    parser.add_argument(
        "--trace",
        type=Path,
        nargs="*",
        default=[],
        help="kineto traces of streaming_bench_profiled to summarise per stream",
    )
    parser.add_argument(
        "--goals",
        action="store_true",
        help="only the layer-streaming goals, point by point (exit 0 met, 1 missed, 3 not all measured)",
    )
    args = parser.parse_args()
    missing = [str(path) for path in args.raw if not path.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    try:
        results = [r for path in args.raw for r in read_results(path)]
    except BadRun as e:
        parser.error(str(e))
    if not any(r["part"] != "grid-setup" for r in results):
        parser.error(
            f"no streaming_bench RESULT lines (nor gpu_vllm streaming runs) in "
            f"{', '.join(map(str, args.raw))}: give their output"
        )
    if args.goals:
        try:
            met, verdict = goals(results)
        except BadRun as e:
            parser.error(str(e))
        print(f"### The layer-streaming goals\n\n{verdict}")
        if met is None:
            print("\nNo goal is missed, but not every goal was measured (exit 3).")
        sys.exit({True: 0, False: 1, None: 3}[met])
    for trace in args.trace:
        print(trace_summary(trace) + "\n")
    peak = max((r["h2d_gbs"] for r in results if r["part"] == "peak"), default=55.0)  # the best any run measured
    for title, table in (
        ("Streaming steps against their bound", grid_table(results)),
        ("Compressed streaming", compressed_table(results)),
        ("Resident layers", curve_table(results)),
        ("Arc Pro B60 (computed)", arc_table(results, peak)),
    ):
        print(f"### {title}\n\n{table}\n")
    if args.plot:
        plot_curve(results, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
