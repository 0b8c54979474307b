"""pipeline.bench.gpu_report --goals: issue 21's goals read from streaming_bench's
output, point by point. Only the engine's own copy method and layout count,
repeated runs of a point count by their median, wrong bytes fail whatever the
speed, and bad input stops with a clear error."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from pipeline.bench import gpu_report

ROOT = Path(__file__).resolve().parents[2]


def result(part: str, kind: str = "decode", context: int = 16384, batch: int = 1, **fields) -> str:
    row = {"part": part, "kind": kind, "context": context, "batch": batch, "new_tokens": 1, "shared_prefix": 0,
           "block": 16, "layers": 32, "resident": 0, "method": "batch", "step_ms": 40.0, "attention_ms": 8.0,
           "bus_ms": 39.0, "bound_ms": 39.0, "ratio": 1.02, "streamed_bytes": 2 << 30, "writeback_bytes": 0,
           "h2d_peak_gbs": 55.0, "mean_run_blocks": 1024.0, "contiguous": False, "homes": "extents",
           "back_to_back": 8}
    row.update(fields)
    return "RESULT " + json.dumps(row)


GRID_HEADER = "grid: 33792 blocks of 16 tokens, homes 70.1 GiB (allocated and zeroed in 51.0 s), copy method batch"


def run_file(tmp_path: Path, name: str, *lines: str) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def goals_of(*paths: Path) -> tuple[bool, str]:
    return gpu_report.goals([r for p in paths for r in gpu_report.read_results(p)])


def test_only_the_engines_own_method_on_extents_with_scattered_ids_counts(tmp_path):
    run = run_file(
        tmp_path, "grid.txt", GRID_HEADER,
        result("grid", ratio=1.366, homes="block-ids", method="gather"),  # the old layout
        result("grid", ratio=1.033, method="gather"),  # another method
        result("grid", ratio=6.9, method="runs"),
        result("grid", ratio=1.07, contiguous=True),  # contiguous ids are not the goal's
        result("grid", ratio=1.026),
        result("grid", kind="prefill", ratio=1.049),
        result("verify", ok=True),
    )
    met, verdict = goals_of(run)
    assert met, verdict
    assert "(batch), at most 1.05x the bound: met at all 2 points; the worst prefill 16k x1 at 1.049x" in verdict


def test_a_point_over_its_bound_misses_the_goal_and_is_named(tmp_path):
    run = run_file(
        tmp_path, "grid.txt", GRID_HEADER,
        result("grid", ratio=1.02),
        result("grid", kind="prefill", ratio=1.062),
        result("grid", context=16400, batch=16, shared_prefix=16384, ratio=1.073),
    )
    met, verdict = goals_of(run)
    assert not met
    assert "**missed** at 2 of 3 points" in verdict
    assert "  - prefill 16k x1: 1.062x" in verdict
    assert "  - decode 16400 x16 sharing a 16k prefix: 1.073x" in verdict
    assert "decode 16k x1:" not in verdict


def test_repeated_runs_of_a_point_count_by_their_median(tmp_path):
    runs = [run_file(tmp_path, f"grid-{i}.txt", GRID_HEADER, result("grid", kind="prefill", ratio=ratio))
            for i, ratio in enumerate((1.04, 1.12, 1.045))]
    met, verdict = goals_of(*runs)
    assert met, verdict
    assert "prefill 16k x1 at 1.045x (median of 3: 1.040, 1.120, 1.045)" in verdict
    met, verdict = goals_of(*runs[1:])  # 1.12 and 1.045: the median is over
    assert not met
    assert "prefill 16k x1: 1.083x (median of 2: 1.120, 1.045)" in verdict


def test_steps_alone_and_back_to_back_are_separate_points(tmp_path):
    run = run_file(tmp_path, "grid.txt", GRID_HEADER, result("grid", ratio=1.09, back_to_back=0),
                   result("grid", ratio=1.02, back_to_back=8))
    met, verdict = goals_of(run)
    assert not met
    assert "at 2 points" not in verdict and "**missed** at 1 of 2 points" in verdict


def test_wrong_bytes_miss_the_goals_however_fast(tmp_path):
    run = run_file(tmp_path, "grid.txt", GRID_HEADER, result("grid", ratio=1.01),
                   result("verify", kind="prefill", context=131072, ok=False), result("verify", ok=True))
    met, verdict = goals_of(run)
    assert not met
    assert "**missed**: 1 of 2 steps" in verdict
    assert "  - prefill 128k x1, extents homes: differ" in verdict
    codec = run_file(tmp_path, "codec.txt", 'RESULT {"part": "codec", "decode_bitwise": false, "encode_bitwise": true}')
    met, verdict = goals_of(codec)
    assert not met and "the device's decode differs from the CPU's" in verdict


def test_compressed_homes_by_the_engines_default_against_their_bound_and_exact(tmp_path):
    def speedup(method: str, value: float, context: int = 131072) -> str:
        return "RESULT " + json.dumps({"part": "compressed-speedup", "method": method, "kind": "decode",
                                       "context": context, "batch": 1, "speedup": value})

    ok = run_file(
        tmp_path, "compressed.txt",
        result("compressed", method="exact-homes", ratio=1.2),  # exact homes' row of the same run
        result("compressed", method="compressed-aten-gather", ratio=1.57),
        result("compressed", method=gpu_report.COMPRESSED_DEFAULT, ratio=1.097),
        speedup("compressed-aten-gather", 1.2),
        speedup(gpu_report.COMPRESSED_DEFAULT, 1.93),
        speedup(gpu_report.COMPRESSED_DEFAULT, 1.1, context=16384),  # not the 128k goal
    )
    met, verdict = goals_of(ok)
    assert met, verdict
    assert "their bound: met at all 1 points; the worst decode 16k x1 at 1.097x" in verdict
    assert "exact homes': met: decode 128k x1 1.930x" in verdict
    assert "exact homes, scattered ids" in verdict and "**not measured** in these files" in verdict

    slow = run_file(tmp_path, "slow.txt", result("compressed", method=gpu_report.COMPRESSED_DEFAULT, ratio=1.12),
                    speedup(gpu_report.COMPRESSED_DEFAULT, 1.55))
    met, verdict = goals_of(slow)
    assert not met
    assert "  - decode 16k x1: 1.120x" in verdict
    assert "exact homes': **missed**: decode 128k x1 1.550x" in verdict


def vllm_json(tmp_path: Path, name: str, *runs: dict) -> Path:
    """gpu_vllm streaming's --out file, with the fields the goal reads."""
    base = {"budget_gib": 4.0, "resident_layers": 0, "homes": "exact", "settle_across_steps": True,
            "decode_step_ms": 80.0, "bus_bound_ms": 78.0}
    path = tmp_path / name
    path.write_text(json.dumps({"peak_h2d_gbps": 55.0, "runs": [{**base, **run} for run in runs]}))
    return path


def test_inside_vllm_every_decode_step_within_its_bound_homes_and_settling_apart(tmp_path):
    first = vllm_json(tmp_path, "a.json", {"context": 32768, "x_bound": 1.01},
                      {"context": 32768, "x_bound": 1.103, "homes": "compressed", "resident_layers": 2},
                      {"context": 32768, "x_bound": 1.2, "settle_across_steps": False})
    met, verdict = goals_of(first)
    assert not met
    assert "**missed** at 2 of 3 points" in verdict
    assert "  - decode 32k x1, compressed homes, 4 GiB, R 2, write-backs settled across steps: 1.103x" in verdict
    assert "  - decode 32k x1, exact homes, 4 GiB, R 0, write-backs settled on the host: 1.200x" in verdict
    again = vllm_json(tmp_path, "b.json", *[{"context": 32768, "x_bound": x, "settle_across_steps": False}
                                            for x in (1.05, 1.04)])
    met, verdict = goals_of(again, vllm_json(tmp_path, "c.json", {"context": 32768, "x_bound": 1.01}))
    assert met, verdict
    assert "(median of 2: 1.050, 1.040)" in verdict
    aten = vllm_json(tmp_path, "d.json", {"context": 32768, "x_bound": 1.3, "homes": "compressed",
                                          "fused_codec": False})  # the A/B, not the engine's default
    met, verdict = goals_of(again, aten)
    assert met and "compressed homes, 4 GiB" not in verdict, verdict


def test_the_recorded_grid_of_2026_12_04_misses_at_prefill_16k_and_the_shared_prefix():
    """The real output: the header and RESULT lines as streaming_bench prints them."""
    met, verdict = goals_of(ROOT / "bench/raw/2026-12-04-gpu-streaming-grid-batch.txt")
    assert not met
    assert "copied by the engine's method (batch)" in verdict
    missed = re.findall(r"^  - (.*): ", verdict, re.M)
    assert missed == ["prefill 16k x1", "decode 16400 x16 sharing a 16k prefix"]


def test_the_grid_header_is_printed_as_the_report_reads_it():
    source = (ROOT / "engine/bench/streaming_bench.cpp").read_text()
    header = re.search(r'std::printf\("(grid: [^"]*)"\s*"([^"]*)"', source)
    assert header, "streaming_bench's grid header printf not found"
    printed = (header.group(1) + header.group(2)).replace("%lld", "1").replace("%.1f", "1.0").replace("%s", "batch")
    assert gpu_report._GRID_HEADER.match(printed.rstrip("\\n")), printed


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.bench.gpu_report", *args], cwd=ROOT,
                          capture_output=True, text=True)


def test_the_exit_status_says_whether_the_goals_are_met(tmp_path):
    met = run_file(tmp_path, "met.txt", GRID_HEADER, result("grid", ratio=1.01))
    missed = run_file(tmp_path, "missed.txt", GRID_HEADER, result("grid", ratio=1.2))
    assert cli("--goals", str(met)).returncode == 0
    out = cli("--goals", str(missed))
    assert out.returncode == 1 and "**missed** at 1 of 1 points" in out.stdout


def test_bad_input_stops_with_a_clear_error(tmp_path):
    other_tool = run_file(tmp_path, "probe.txt", 'RESULT {"gbs": 54.4}')
    out = cli("--goals", str(other_tool))
    assert out.returncode == 2 and "no streaming_bench RESULT lines (nor gpu_vllm streaming runs) in" in out.stderr, out.stderr
    two_devices = [run_file(tmp_path, "a.txt", GRID_HEADER, result("grid")),
                   run_file(tmp_path, "b.txt", GRID_HEADER.replace("batch", "gather"), result("grid"))]
    out = cli("--goals", *map(str, two_devices))
    assert out.returncode == 2 and "different copy methods (batch, gather)" in out.stderr, out.stderr
    ttft_only = tmp_path / "ttft.json"
    ttft_only.write_text(json.dumps({"lengths": [1024], "engines": {}}))
    out = cli("--goals", str(ttft_only))
    assert out.returncode == 2 and "nor gpu_vllm streaming runs" in out.stderr, out.stderr
    out = cli("--goals", str(tmp_path / "none.txt"))
    assert out.returncode == 2 and "no such file:" in out.stderr, out.stderr
