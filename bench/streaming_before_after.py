"""The layer streamer before and after an engine change, from the runs of
ci/gpu-streaming-before-after.sh: one row per point, with each side's step
time (the median over its rounds, and their spread), after / before of the
medians, and each side's median step against its bound. Step times are
compared, not the ratios: a run's bound comes from the bus's peak measured at
its own start, which moves by a percent or two from run to run.

    python -m bench.streaming_before_after DIR [DIR ...]

DIR holds PART-SIDE-ROUND.txt files (SIDE: after or before); several DIRs
(one per call on the GPU machine) are read as one set of rounds.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict
from pathlib import Path

from bench.gpu_report.results import point_name, read_results

RUN_FILE = re.compile(r"^(?P<part>[a-z]+)-(?P<side>after|before)-(?P<round>\d+)\.txt$")
SIDES = ("after", "before")


def point_label(r: dict) -> str:
    return f"{r['part']} {point_name(r)}, {r['homes']}, {r['method']}"


def steps_by_point(dirs: list[Path]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """{point: {side: [(step ms, step / bound) of each round]}}, points in
    the order the runs first measured them."""
    found: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: {side: [] for side in SIDES})
    files = sorted(
        (int(m["round"]), m["side"], path) for d in dirs for path in d.iterdir() if (m := RUN_FILE.match(path.name))
    )
    if not files:
        raise SystemExit(f"no PART-SIDE-ROUND.txt runs in {', '.join(map(str, dirs))}")
    for _, side, path in files:
        for r in read_results(path):
            if r["part"] in ("grid", "compressed") and "ratio" in r:
                found[point_label(r)][side].append((r["step_ms"], r["ratio"]))
    return found


def table(found: dict[str, dict[str, list[tuple[float, float]]]]) -> tuple[list[str], float]:
    """The table's lines, and the largest |after / before - 1| of the median
    step times among the points both sides measured."""
    lines = [
        "| point | after: median step ms (rounds, spread); / bound | before | after / before |",
        "|---|---|---|---|",
    ]
    worst = 0.0
    for label, sides in found.items():
        after, before = sides["after"], sides["before"]
        if not after or not before:
            lines.append(f"| {label} | {cell(after)} | {cell(before)} | one side only |")
            continue
        change = median_step(after) / median_step(before)
        worst = max(worst, abs(change - 1))
        lines.append(f"| {label} | {cell(after)} | {cell(before)} | {change:.4f} |")
    return lines, worst


def median_step(runs: list[tuple[float, float]]) -> float:
    return statistics.median(step for step, _ in runs)


def cell(runs: list[tuple[float, float]]) -> str:
    if not runs:
        return "not measured"
    steps = [step for step, _ in runs]
    ratio = statistics.median(ratio for _, ratio in runs)
    return f"{statistics.median(steps):.2f} ({len(steps)}, {min(steps):.2f}-{max(steps):.2f}); {ratio:.3f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args()
    lines, worst = table(steps_by_point(args.dirs))
    print("\n".join(lines))
    print(f"\nlargest change of a point's median step, after against before: {worst:.2%}")


if __name__ == "__main__":
    main()
