"""bench.streaming_before_after: the before/after table from
ci/gpu-streaming-before-after.sh's runs. Each side's rounds count by their
median step time, the change is after's median over before's, a point one
side never reached says so and does not count, and a folder with no runs stops."""

from __future__ import annotations

import json
import statistics

import pytest

from bench import streaming_before_after as sba


def run_file(path, points):
    """A streaming_bench output with a RESULT line per (method, ratio): a
    step of 40 ms x ratio against a bound of 40 ms."""
    lines = ["device cuda; 32 layers", 'RESULT {"part": "peak", "h2d_gbs": 55.0, "d2h_gbs": 55.0}']
    for method, ratio in points:
        row = {
            "part": "grid",
            "kind": "decode",
            "context": 16384,
            "batch": 1,
            "new_tokens": 1,
            "shared_prefix": 0,
            "block": 16,
            "layers": 32,
            "resident": 0,
            "method": method,
            "step_ms": 40.0 * ratio,
            "bus_ms": 40.0,
            "bound_ms": 40.0,
            "ratio": ratio,
            "homes": "extents",
            "back_to_back": 8,
            "h2d_peak_gbs": 55.0,
        }
        lines.append("RESULT " + json.dumps(row))
    path.write_text("\n".join(lines) + "\nrc=124\n")


def test_medians_over_rounds_and_the_change(tmp_path):
    after = [1.02, 1.05, 1.01]
    before = [1.03, 1.00, 1.04]
    for n, (a, b) in enumerate(zip(after, before, strict=True), 1):
        run_file(tmp_path / f"grid-after-{n}.txt", [("batch", a), ("gather", 1.5)])
        run_file(tmp_path / f"grid-before-{n}.txt", [("batch", b)])
    found = sba.steps_by_point([tmp_path])
    batch = next(label for label in found if label.endswith(", batch"))
    assert [ratio for _, ratio in found[batch]["after"]] == after
    assert [ratio for _, ratio in found[batch]["before"]] == before
    lines, worst = sba.table(found)
    change = statistics.median(40.0 * r for r in after) / statistics.median(40.0 * r for r in before)
    assert f"{change:.4f}" in next(line for line in lines if line.startswith(f"| {batch} |"))
    # the gather point only "after" reached: shown, not counted
    assert any(", gather |" in line and "one side only" in line for line in lines)
    assert worst == pytest.approx(abs(change - 1))


def test_rounds_from_several_folders_are_one_set(tmp_path):
    for n, folder in ((1, "first"), (2, "second")):
        (tmp_path / folder).mkdir()
        run_file(tmp_path / folder / f"grid-after-{n}.txt", [("batch", 1.0 + n / 100)])
        run_file(tmp_path / folder / f"grid-before-{n}.txt", [("batch", 1.0)])
    found = sba.steps_by_point([tmp_path / "first", tmp_path / "second"])
    (sides,) = found.values()
    assert {side: [ratio for _, ratio in runs] for side, runs in sides.items()} == {
        "after": [1.01, 1.02],
        "before": [1.0, 1.0],
    }


def test_a_folder_without_runs_stops_and_names_it(tmp_path):
    (tmp_path / "grid-after.txt").write_text("not a round's file name\n")
    with pytest.raises(SystemExit, match=str(tmp_path)):
        sba.steps_by_point([tmp_path])
