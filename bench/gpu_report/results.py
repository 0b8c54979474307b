"""streaming_bench's RESULT lines and gpu_vllm streaming's JSON, read back
as result rows, and what names a point."""

from __future__ import annotations

import json
import re
from pathlib import Path

# The grid's header names the copy method the engine chose on the device.
GRID_HEADER = re.compile(r"^grid: .*, copy method (\S+)$")
# What a run measured; every other field of a point says which point it is.
MEASURED = {"step_ms", "attention_ms", "bus_ms", "bound_ms", "ratio", "h2d_peak_gbs", "host_ms", "speedup", "ok"}


class BadRun(ValueError):
    """A file the report cannot read: which, where and why."""


def read_results(path: Path) -> list[dict]:
    """The RESULT lines of one streaming_bench output (each names its part;
    other tools' lines do not), and the grid's default copy method from its
    header as {"part": "grid-setup", "copy_method": ...}; or gpu_vllm
    streaming's JSON (a .json file) as {"part": "vllm", ...} points."""
    if path.suffix == ".json":
        return _vllm_runs(path)
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("RESULT "):
            try:
                result = json.loads(line[len("RESULT ") :])
            except ValueError as e:
                raise BadRun(f"{path}:{number}: a RESULT line that is not JSON ({e}): a run cut off?") from e
            if "part" in result:
                out.append(result)
        elif header := GRID_HEADER.match(line):
            out.append({"part": "grid-setup", "copy_method": header.group(1)})
    return _against_best_peak(out, path)


def _against_best_peak(results: list[dict], path: Path) -> list[dict]:
    """Each point's bound against its run's best host-to-device peak.

    streaming_bench measures the bus's peak before its points and, since
    2026-12-05, again after them ("when": "end"), and prints each point
    against the first. A peak read low (50-54 GB/s against the usual 55 on
    the H200; on one H100 run a bus-bound step read 0.967x its bound) flatters
    every point of that run, so a point's bus time is taken at the higher of
    its run's two. A peak line without "when" starts a run: outputs appended
    into one file stay apart. Each point takes its run's GPU, named by the
    first peak line since 2026-12-05 (None before)."""
    runs: list[list[dict]] = [[]]
    for r in results:
        if r["part"] == "peak" and r.get("when") != "end" and runs[-1]:
            runs.append([])
        runs[-1].append(r)
    for run in runs:
        peaks = [r for r in run if r["part"] == "peak"]
        if any(not isinstance(p.get("h2d_gbs"), (int, float)) for p in peaks):
            raise BadRun(f"{path}: a peak line without its h2d_gbs: not streaming_bench's output?")
        if not peaks:
            continue
        best = max(p["h2d_gbs"] for p in peaks)
        for r in run:
            r.setdefault("gpu", peaks[0].get("gpu"))
            if "bus_ms" not in r or r.get("h2d_peak_gbs", best) >= best:
                continue
            if any(field not in r for field in ("attention_ms", "step_ms")):
                raise BadRun(f"{path}: a {r['part']} point without its attention_ms or step_ms: a line cut short?")
            r["bus_ms"] *= r["h2d_peak_gbs"] / best
            r["bound_ms"] = max(r["attention_ms"], r["bus_ms"])
            r["ratio"] = r["step_ms"] / r["bound_ms"]
            r["h2d_peak_gbs"] = best
    return results


def _vllm_runs(path: Path) -> list[dict]:
    """gpu_vllm streaming's decode steps as points. Two kinds of run are left
    out, and said to be ({"part": "left-out"}): runs timed before the timed pair
    waited for the prefill's leftovers (817bed5: the 32k step had read 0.87x;
    they have no first_hit_ms), and compressed homes' runs that do not say the
    fused kernels were on (recorded before 2026-12-05; the A/B against ATen's
    operations turned them off by ACTIVEKV_FUSED_CODEC=0, the same JSON)."""
    try:
        record = json.loads(path.read_text())
        runs = record["runs"]
    except (ValueError, KeyError, TypeError):
        return []
    machine = record.get("machine") if isinstance(record.get("machine"), dict) else {}
    out = []
    for number, r in enumerate(runs, 1):
        if not isinstance(r, dict) or "x_bound" not in r:
            continue
        if "first_hit_ms" not in r:
            out.append({"part": "left-out", "why": "timed before the decode step waited for the prefill's leftovers"})
            continue
        if r.get("homes") == "compressed" and r.get("fused_codec_turned_off", True):
            out.append({"part": "left-out", "why": "compressed homes without the fused kernels, or not saying"})
            continue
        try:
            out.append(
                {
                    "part": "vllm",
                    "kind": "decode",
                    "context": r["context"],
                    "batch": 1,
                    "homes": r["homes"],
                    "budget_gib": r["budget_gib"],
                    "resident": r["resident_layers"],
                    # Before the knob (2026-12-05) write-backs settled on the host.
                    "method": "write-backs settled "
                    + ("across steps" if r.get("settle_across_steps") else "on the host"),
                    "graphs": r["cudagraph_mode"],
                    "async_scheduling": r.get("async_scheduling"),
                    "ratio": r["x_bound"],
                    "gpu": machine.get("gpu"),
                }
            )
        except KeyError as e:
            raise BadRun(f"{path}: run {number} has no {e.args[0]!r}: not gpu_vllm streaming's output?") from e
    return out


def tokens_k(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def point_name(r: dict) -> str:
    """A point's name in the goals' lines, with every setting that makes it
    another point: decode 128k x4, 8 back to back; prefill 16k x1, alone; ..."""
    name = f"{r['kind']} {tokens_k(r['context'])} x{r['batch']}"
    if r.get("shared_prefix"):
        name += f" sharing a {tokens_k(r['shared_prefix'])} prefix"
    if r["part"] == "vllm":
        scheduling = {True: ", async scheduling", False: ", sync scheduling"}.get(r["async_scheduling"], "")
        return (
            f"{name}, {r['homes']} homes, {r['budget_gib']:g} GiB, R {r['resident']}, {r['method']}, "
            f"{r['graphs']} graphs{scheduling}"
        )
    name += ", contiguous ids" if r.get("contiguous") else ""
    name += f", {r['back_to_back']} back to back" if r.get("back_to_back") else ", alone"
    for field, usual in (("ring", 2), ("id_runs", 1), ("block", 16)):
        if r.get(field, usual) != usual:
            name += f", {field.replace('_', ' ')} {r[field]}"
    return name
