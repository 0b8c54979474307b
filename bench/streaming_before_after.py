"""The layer streamer before and after an engine change, from the runs of
ci/gpu-streaming-before-after.sh: one row per point that both sides measured,
with each side's step-to-bound ratio (the median over its rounds, and their
spread) and after / before of the medians.

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


def ratios_by_point(dirs: list[Path]) -> dict[str, dict[str, list[float]]]:
    """{point: {side: [step / bound of each round]}}, points in the order the
    runs first measured them."""
    found: dict[str, dict[str, list[float]]] = defaultdict(lambda: {side: [] for side in SIDES})
    files = sorted(
        (int(m["round"]), m["side"], path) for d in dirs for path in d.iterdir() if (m := RUN_FILE.match(path.name))
    )
    if not files:
        raise SystemExit(f"no PART-SIDE-ROUND.txt runs in {', '.join(map(str, dirs))}")
    for _, side, path in files:
        for r in read_results(path):
            if r["part"] in ("grid", "compressed") and "ratio" in r:
                found[point_label(r)][side].append(r["ratio"])
    return found


def table(found: dict[str, dict[str, list[float]]]) -> tuple[list[str], float]:
    """The table's lines, and the largest |after / before - 1| among the
    points both sides measured."""
    lines = [
        "| point | after: median step / bound (rounds, spread) | before | after / before |",
        "|---|---|---|---|",
    ]
    worst = 0.0
    for label, sides in found.items():
        after, before = sides["after"], sides["before"]
        if not after or not before:
            lines.append(f"| {label} | {cell(after)} | {cell(before)} | one side only |")
            continue
        change = statistics.median(after) / statistics.median(before)
        worst = max(worst, abs(change - 1))
        lines.append(f"| {label} | {cell(after)} | {cell(before)} | {change:.4f} |")
    return lines, worst


def cell(ratios: list[float]) -> str:
    if not ratios:
        return "not measured"
    return f"{statistics.median(ratios):.3f}x ({len(ratios)}, {min(ratios):.3f}-{max(ratios):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args()
    lines, worst = table(ratios_by_point(args.dirs))
    print("\n".join(lines))
    print(f"\nlargest change of a point's median, after against before: {worst:.2%}")


if __name__ == "__main__":
    main()
