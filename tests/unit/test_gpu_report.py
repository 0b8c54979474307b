"""bench.gpu_report --goals: the layer-streaming goals read from streaming_bench's
output and gpu_vllm's JSON, point by point. Only the engine's own copy method
and layout count, repeated runs of a point count by their median, settings that
make another point stay apart, wrong bytes fail whatever the speed, a goal with
no data is not met, and bad input stops with a clear error."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_report import goals as report_goals
from bench.gpu_report import results as report_results

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "bench" / "raw"
GRID_HEADER = "grid: 33792 blocks of 16 tokens, homes 70.1 GiB (allocated and zeroed in 51.0 s), copy method batch"


def result(part: str, kind: str = "decode", context: int = 16384, batch: int = 1, **fields) -> str:
    """A RESULT line as streaming_bench prints it."""
    row = {
        "part": part,
        "kind": kind,
        "context": context,
        "batch": batch,
        "new_tokens": 1,
        "shared_prefix": 0,
        "block": 16,
        "layers": 32,
        "resident": 0,
        "method": "batch",
        "step_ms": 40.0,
        "attention_ms": 8.0,
        "bus_ms": 39.0,
        "bound_ms": 39.0,
        "ratio": 1.02,
        "streamed_bytes": 2 << 30,
        "writeback_bytes": 0,
        "h2d_peak_gbs": 55.0,
        "mean_run_blocks": 1024.0,
        "contiguous": False,
        "homes": "extents",
        "host_ms": 30.0,
        "ring": 2,
        "id_runs": 1,
        "back_to_back": 8,
    }
    row.update(fields)
    return "RESULT " + json.dumps(row)


def speedup(
    value: float,
    kind: str = "decode",
    context: int = 131072,
    method: str = report_goals.COMPRESSED_DEFAULT,
    back_to_back: int = 8,
) -> str:
    return "RESULT " + json.dumps(
        {
            "part": "compressed-speedup",
            "method": method,
            "kind": kind,
            "context": context,
            "batch": 1,
            "back_to_back": back_to_back,
            "speedup": value,
        }
    )


def run_file(tmp_path: Path, name: str, *lines: str) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def vllm_json(tmp_path: Path, name: str, *runs: dict) -> Path:
    """gpu_vllm streaming's --out file, with the fields the goal reads."""
    base = {
        "budget_gib": 4.0,
        "resident_layers": 0,
        "homes": "exact",
        "settle_across_steps": True,
        "cudagraph_mode": "PIECEWISE",
        "async_scheduling": True,
        "first_hit_ms": 120.0,
        "fused_codec_turned_off": False,
        "decode_step_ms": 80.0,
        "bus_bound_ms": 78.0,
    }
    path = tmp_path / name
    path.write_text(json.dumps({"peak_h2d_gbps": 55.0, "runs": [{**base, **run} for run in runs]}))
    return path


def goals_of(*paths: Path) -> tuple[bool | None, str]:
    return report_goals.goals([r for p in paths for r in report_results.read_results(p)])


def line_of(verdict: str, starts: str) -> str:
    """The verdict's line for one goal."""
    return next(line for line in verdict.splitlines() if line.startswith(starts))


def test_only_the_engines_own_method_on_extents_with_scattered_ids_counts(tmp_path):
    run = run_file(
        tmp_path,
        "grid.txt",
        GRID_HEADER,
        result("grid", ratio=1.366, homes="block-ids"),  # the old layout, by the engine's method
        result("grid", ratio=1.033, method="gather"),  # another method
        result("grid", ratio=6.9, method="runs"),
        result("grid", ratio=1.07, contiguous=True),  # contiguous ids are not the goal's
        result("grid", ratio=1.026),
        result("grid", kind="prefill", ratio=1.049),
    )
    _, verdict = goals_of(run)
    assert line_of(verdict, "- exact homes") == (
        "- exact homes, scattered ids, copied by the engine's method batch, at most 1.05x the bound: "
        "met at all 2 points on a GPU its file does not name; the worst prefill 16k x1, 8 back to back: 1.049x"
    )


def test_a_point_over_its_bound_misses_the_goal_and_is_named(tmp_path):
    run = run_file(
        tmp_path,
        "grid.txt",
        GRID_HEADER,
        result("grid", ratio=1.02),
        result("grid", kind="prefill", ratio=1.062),
        result("grid", context=16400, batch=16, shared_prefix=16384, ratio=1.073),
    )
    met, verdict = goals_of(run)
    assert met is False
    assert "**missed** at 2 of 3 points" in verdict
    missed = re.findall(r"^  - (.*)$", verdict, re.M)
    assert missed == [
        "prefill 16k x1, 8 back to back: 1.062x",
        "decode 16400 x16 sharing a 16k prefix, 8 back to back: 1.073x",
    ]


def test_repeated_runs_of_a_point_count_by_their_median(tmp_path):
    runs = [
        run_file(
            tmp_path,
            f"grid-{i}.txt",
            GRID_HEADER,
            result("grid", kind="prefill", ratio=ratio, h2d_peak_gbs=54 + i, host_ms=30 + i),
        )
        for i, ratio in enumerate((1.04, 1.12, 1.045))
    ]
    _, verdict = goals_of(*runs)
    assert (
        "met at the one point on a GPU its file does not name; the worst prefill 16k x1, 8 back to back: 1.045x "
        "(median of 3: 1.040, 1.120, 1.045)" in verdict
    )
    met, verdict = goals_of(*runs[1:])  # 1.12 and 1.045: the median is over
    assert met is False
    assert "  - prefill 16k x1, 8 back to back: 1.083x (median of 2: 1.120, 1.045)" in verdict


def test_each_point_is_read_against_the_best_peak_its_run_measured(tmp_path):
    """A peak read low at the start flatters the run's points: the one after
    the points (or before, whichever is higher) is the bus's."""

    def peak(gbs, **when):
        return "RESULT " + json.dumps({"part": "peak", "h2d_gbs": gbs, "d2h_gbs": 55.0, **when})

    low_first = run_file(
        tmp_path,
        "low.txt",
        peak(52.0),
        GRID_HEADER,
        result("grid", step_ms=42.0, attention_ms=8.0, bus_ms=41.0, bound_ms=41.0, ratio=42 / 41, h2d_peak_gbs=52.0),
        peak(55.0, when="end"),
    )
    row = next(r for r in report_results.read_results(low_first) if r["part"] == "grid")
    assert row["bus_ms"] == pytest.approx(41.0 * 52 / 55)
    assert row["ratio"] == pytest.approx(42.0 / (41.0 * 52 / 55))
    met, verdict = goals_of(low_first)  # 1.024x as printed, 1.083x against the bus's best
    assert met is False and "decode 16k x1, 8 back to back: 1.083x" in verdict
    # The start's peak the best: the rows stand as printed.
    high_first = run_file(
        tmp_path, "high.txt", peak(55.0), GRID_HEADER, result("grid", ratio=1.02), peak(54.0, when="end")
    )
    assert next(r for r in report_results.read_results(high_first) if r["part"] == "grid")["ratio"] == 1.02
    # Two outputs appended into one file: each run's rows against their own run's peaks.
    appended = run_file(
        tmp_path,
        "appended.txt",
        peak(52.0),
        GRID_HEADER,
        result("grid", ratio=1.02, h2d_peak_gbs=52.0),
        peak(52.5, when="end"),
        peak(55.0),
        GRID_HEADER,
        result("grid", ratio=1.03),
        peak(55.0, when="end"),
    )
    first, second = (r for r in report_results.read_results(appended) if r["part"] == "grid")
    assert first["h2d_peak_gbs"] == 52.5 and second["ratio"] == 1.03


def test_each_goal_says_which_gpus_its_points_came_from(tmp_path):
    """The goals name the H200: a verdict whose points an H100 measured says so."""

    def peak(**gpu):
        return "RESULT " + json.dumps({"part": "peak", "h2d_gbs": 55.0, "d2h_gbs": 55.0, **gpu})

    h100 = run_file(
        tmp_path, "h100.txt", peak(gpu="NVIDIA H100 80GB HBM3"), GRID_HEADER, result("grid"), peak(when="end")
    )
    unnamed = run_file(tmp_path, "old.txt", peak(), GRID_HEADER, result("grid", context=65536))
    vllm = vllm_json(tmp_path, "v.json", {"context": 32768, "x_bound": 1.01})
    record = json.loads(vllm.read_text())
    vllm.write_text(json.dumps({**record, "machine": {"gpu": "NVIDIA H200"}}))
    _, verdict = goals_of(h100, unnamed, vllm)
    assert "met at all 2 points on NVIDIA H100 80GB HBM3 and a GPU its file does not name;" in line_of(
        verdict, "- exact homes"
    )
    assert "met at the one point on NVIDIA H200;" in line_of(verdict, "- inside vLLM")
    # The same point on two GPUs: two points, each naming its GPU, never one median.
    h200 = run_file(tmp_path, "h200.txt", peak(gpu="NVIDIA H200"), GRID_HEADER, result("grid", ratio=1.09))
    _, verdict = goals_of(h100, h200)
    assert re.findall(r"^  - (.*)$", verdict, re.M) == ["decode 16k x1, 8 back to back, NVIDIA H200: 1.090x"]
    assert "missed** at 1 of 2 points on NVIDIA H100 80GB HBM3 and NVIDIA H200;" in line_of(verdict, "- exact homes")


def test_settings_that_make_another_point_keep_it_apart(tmp_path):
    run = run_file(
        tmp_path,
        "grid.txt",
        GRID_HEADER,
        result("grid", ratio=1.02),
        result("grid", ratio=1.09, back_to_back=0),
        result("grid", ratio=1.2, ring=3),
        result("grid", ratio=1.3, id_runs=16),
        result("grid", ratio=1.4, block=32),
    )
    _, verdict = goals_of(run)
    assert re.findall(r"^  - (.*)$", verdict, re.M) == [
        "decode 16k x1, alone: 1.090x",
        "decode 16k x1, 8 back to back, ring 3: 1.200x",
        "decode 16k x1, 8 back to back, id runs 16: 1.300x",
        "decode 16k x1, 8 back to back, block 32: 1.400x",
    ]


def test_wrong_bytes_miss_the_goals_however_fast(tmp_path):
    run = run_file(
        tmp_path,
        "grid.txt",
        GRID_HEADER,
        result("grid", ratio=1.01),
        result("verify", kind="prefill", context=131072, ok=False),
        result("verify", ok=True),
    )
    met, verdict = goals_of(run)
    assert met is False
    bytes_line = line_of(verdict, "- every staged")
    assert bytes_line.endswith(": **missed**: 1 of 2 steps")  # no codec row: nothing said of it
    assert "  - prefill 128k x1, extents homes: differ" in verdict
    codec = run_file(
        tmp_path,
        "codec.txt",
        result("verify", ok=True),
        'RESULT {"part": "codec", "decode_bitwise": false, "encode_bitwise": true}',
    )
    met, verdict = goals_of(codec)
    assert met is False
    assert line_of(verdict, "- every staged").endswith(
        ": **missed**: 1 of 1 steps; the device's decode differs from the CPU's"
    )


def test_compressed_homes_by_the_engines_default_against_their_bound_and_exact(tmp_path):
    ok = run_file(
        tmp_path,
        "compressed.txt",
        result("compressed", method="exact-homes", ratio=1.2),  # exact homes' row of the same run
        result("compressed", method="compressed-aten-gather", ratio=1.57),
        result("compressed", method=report_goals.COMPRESSED_DEFAULT, ratio=1.097),
        speedup(1.2, method="compressed-aten-gather"),
        speedup(1.93),
        speedup(1.1, context=16384),  # not the 128k goal's
        speedup(1.49, kind="prefill"),  # nor prefill
    )
    _, verdict = goals_of(ok)
    assert line_of(verdict, "- compressed homes (").endswith(
        "their bound: met at the one point on a GPU its file does not name; the worst decode 16k x1, 8 back to back: 1.097x"  # noqa: E501
    )
    assert line_of(verdict, "- compressed homes' tokens/s").endswith(
        "exact homes': met at the one point on a GPU its file does not name; the worst decode 128k x1, 8 back to back: 1.930x"  # noqa: E501
    )
    slow = run_file(
        tmp_path,
        "slow.txt",
        result("compressed", method=report_goals.COMPRESSED_DEFAULT, ratio=1.12),
        speedup(1.55),
        speedup(1.9, back_to_back=0),
    )
    met, verdict = goals_of(slow)
    assert met is False
    assert "  - decode 16k x1, 8 back to back: 1.120x" in verdict
    assert line_of(verdict, "- compressed homes' tokens/s").endswith(
        "**missed** at 1 of 2 points on a GPU its file does not name; the worst decode 128k x1, 8 back to back: 1.550x"
    )


def test_inside_vllm_each_homes_budget_and_setting_is_a_point(tmp_path):
    first = vllm_json(
        tmp_path,
        "a.json",
        {"context": 32768, "x_bound": 1.01},
        {"context": 32768, "x_bound": 1.103, "homes": "compressed", "resident_layers": 2},
        {"context": 32768, "x_bound": 1.2, "settle_across_steps": False},
        {"context": 32768, "x_bound": 1.3, "budget_gib": 8.0},
        {"context": 32768, "x_bound": 1.4, "cudagraph_mode": "NONE", "async_scheduling": False},
    )
    met, verdict = goals_of(first)
    assert met is False
    assert re.findall(r"^  - (.*)$", verdict, re.M) == [
        "decode 32k x1, compressed homes, 4 GiB, R 2, write-backs settled across steps, PIECEWISE graphs, "
        "async scheduling: 1.103x",
        "decode 32k x1, exact homes, 4 GiB, R 0, write-backs settled on the host, PIECEWISE graphs, "
        "async scheduling: 1.200x",
        "decode 32k x1, exact homes, 8 GiB, R 0, write-backs settled across steps, PIECEWISE graphs, "
        "async scheduling: 1.300x",
        "decode 32k x1, exact homes, 4 GiB, R 0, write-backs settled across steps, NONE graphs, "
        "sync scheduling: 1.400x",
    ]
    again = [vllm_json(tmp_path, f"b{i}.json", {"context": 32768, "x_bound": x}) for i, x in enumerate((1.12, 1.04))]
    _, verdict = goals_of(*again, vllm_json(tmp_path, "c.json", {"context": 32768, "x_bound": 1.05}))
    assert "met at the one point" in verdict and "(median of 3: 1.120, 1.040, 1.050)" in verdict


def test_vllm_runs_the_goal_cannot_trust_are_left_out_and_said_to_be(tmp_path):
    runs = vllm_json(
        tmp_path,
        "old.json",
        {"context": 32768, "x_bound": 1.3, "homes": "compressed", "fused_codec_turned_off": True},
        {"context": 65536, "x_bound": 1.3, "homes": "compressed", "fused_codec_turned_off": None},
        {"context": 131072, "x_bound": 0.87, "first_hit_ms": None},
    )
    data = json.loads(runs.read_text())
    for run in data["runs"]:  # fields absent, as in runs recorded before them
        for field in ("fused_codec_turned_off", "first_hit_ms"):
            if run[field] is None:
                del run[field]
    runs.write_text(json.dumps(data))
    met, verdict = goals_of(runs)
    assert met is None
    assert "- inside vLLM, a decode step at most 1.10x the bus's bound: **not measured** in these files" in verdict
    assert "- left out: 2 vLLM runs, compressed homes without the fused kernels, or not saying" in verdict
    assert "- left out: 1 vLLM run, timed before the decode step waited for the prefill's leftovers" in verdict


def test_the_recorded_runs_of_2026_12_04_miss_at_prefill_16k_and_the_shared_prefix():
    """The real outputs, as streaming_bench printed them."""
    met, verdict = goals_of(
        RAW / "2026-12-04-gpu-streaming-grid-batch.txt", RAW / "2026-12-04-gpu-streaming-compressed-batch.txt"
    )
    assert met is False
    assert "copied by the engine's method batch" in verdict
    assert re.findall(r"^  - (.*): ", verdict, re.M) == [
        "prefill 16k x1, alone",
        "decode 16400 x16 sharing a 16k prefix, alone",
    ]
    assert line_of(verdict, "- compressed homes (").endswith("1.097x")  # the shared prefix, its worst
    assert line_of(verdict, "- compressed homes' tokens/s").startswith(  # prefill 128k's 1.493x is not in it
        "- compressed homes' tokens/s at 128k decode, at least 1.6x exact homes': met at all 2 points"
    )


def test_the_grid_header_is_printed_as_the_report_reads_it():
    source = (ROOT / "engine/bench/streaming/grid.cpp").read_text()
    header = re.search(r'std::printf\(\s*"(grid: [^"]*)"\s*"([^"]*)"', source)
    assert header, "streaming_bench's grid header printf not found"
    printed = (header.group(1) + header.group(2)).replace("%lld", "1").replace("%.1f", "1.0").replace("%s", "batch")
    assert report_results.GRID_HEADER.match(printed.removesuffix("\\n")), printed


def cli(*args: Path | str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.gpu_report", *map(str, args)], cwd=ROOT, capture_output=True, text=True
    )


def test_the_exit_status_says_met_missed_or_not_all_measured(tmp_path):
    grid = run_file(tmp_path, "grid.txt", GRID_HEADER, result("grid", ratio=1.01), result("verify", ok=True))
    compressed = run_file(
        tmp_path,
        "compressed.txt",
        result("compressed", method=report_goals.COMPRESSED_DEFAULT, ratio=1.05),
        speedup(1.9),
    )
    vllm = vllm_json(tmp_path, "vllm.json", {"context": 32768, "x_bound": 1.02})
    assert cli("--goals", grid, compressed, vllm).returncode == 0
    out = cli("--goals", grid)
    assert out.returncode == 3 and "not every goal was measured" in out.stdout
    missed = run_file(tmp_path, "missed.txt", GRID_HEADER, result("grid", ratio=1.2))
    out = cli("--goals", missed, compressed, vllm)
    assert out.returncode == 1 and "**missed** at 1 of 1 points" in out.stdout


def test_bad_input_stops_with_a_clear_error(tmp_path):
    cases = [
        (
            [run_file(tmp_path, "probe.txt", 'RESULT {"gbs": 54.4}')],
            "no streaming_bench RESULT lines (nor gpu_vllm streaming runs) in",
        ),
        (
            [
                run_file(tmp_path, "a.txt", GRID_HEADER, result("grid")),
                run_file(tmp_path, "b.txt", GRID_HEADER.replace("batch", "gather"), result("grid")),
            ],
            "different copy methods (batch, gather)",
        ),
        ([run_file(tmp_path, "headless.txt", result("grid", ratio=1.3))], "grid rows without the grid's header"),
        (
            [run_file(tmp_path, "cut.txt", GRID_HEADER, result("grid")[:60])],
            "cut.txt:2: a RESULT line that is not JSON",
        ),
        (
            [vllm_json(tmp_path, "odd.json", {"context": 32768, "x_bound": 1.0, "homes": None})],
            "odd.json: run 1 has no",
        ),
        ([tmp_path / "none.txt"], "no such file:"),
        (
            [
                run_file(
                    tmp_path, "peakless.txt", 'RESULT {"part": "peak", "d2h_gbs": 55.0}', GRID_HEADER, result("grid")
                )
            ],
            "peakless.txt: a peak line without its h2d_gbs",
        ),
    ]
    data = json.loads((tmp_path / "odd.json").read_text())
    del data["runs"][0]["budget_gib"]
    (tmp_path / "odd.json").write_text(json.dumps(data))
    for files, error in cases:
        out = cli("--goals", *files)
        assert out.returncode == 2 and error in out.stderr and "Traceback" not in out.stderr, (files, out.stderr)
