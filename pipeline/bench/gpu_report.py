"""Tables (and the resident-layers plot) for BENCHMARKS.md from streaming_bench's raw output.

streaming_bench (engine/bench/streaming_bench.cpp) prints a ``RESULT {json}``
line per measured point. This reads them back and prints the markdown tables
BENCHMARKS.md quotes, including the Arc Pro B60 table, which is *computed*
from the H200's measured ratios and the card's published link and memory
figures, never measured.

    python -m pipeline.bench.gpu_report bench/raw/<run>.txt [--plot PNG] [--trace TRACE.json.gz ...]
    python -m pipeline.bench.gpu_report --goals bench/raw/<grid>.txt bench/raw/<compressed>.txt

--goals says, point by point, whether issue 21's goals are met by the runs
given (several runs of a point: their median), and exits 1 when one is missed.
It also reads `python -m pipeline.bench.gpu_vllm streaming --out X.json`'s
JSON for the goal inside vLLM.

The plot needs matplotlib (not a dependency of the project: install it in a
throwaway environment to redraw it).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

# Arc Pro B60 (BMG-G21): PCIe 5.0 x8, 24 GB GDDR6 on a 192-bit bus at 456 GB/s
# (technical.city's specification table of the card). PCIe 5.0 carries 32 GT/s
# a lane with 128b/130b coding: 31.5 GB/s for x8 before protocol overhead.
ARC_LINK_GBS = 32 * 8 * 128 / 130 / 8
ARC_MEMORY_GBS = 456.0
# Llama-3-8B in bf16: what a decode step reads besides the KV cache.
WEIGHT_BYTES = 16.06e9


# Issue 21's goals. Exact homes: every point with scattered ids at most 1.05x
# its bound, copied by the engine's own method. Compressed homes, by the
# engine's default on CUDA (fused codec kernels, batched copies): at most 1.10x
# their bound, and at least 1.6x exact homes' tokens/s at 128k decode.
EXACT_GOAL = 1.05
COMPRESSED_GOAL = 1.10
SPEEDUP_GOAL = 1.6
# Inside vLLM (pipeline.bench.gpu_vllm streaming's JSON): a decode step at
# most 1.10x the bus's bound, exact and compressed homes alike.
VLLM_GOAL = 1.10
COMPRESSED_DEFAULT = "compressed-fused-batch"

# The grid's header names the copy method the engine chose on the device.
_GRID_HEADER = re.compile(r"^grid: .*, copy method (\S+)$")


def read_results(path: Path) -> list[dict]:
    """The RESULT lines of one streaming_bench output (each names its part;
    other tools' lines do not), and the grid's default copy method from its
    header as {"part": "grid-setup", "copy_method": ...}."""
    if path.suffix == ".json":
        return _vllm_runs(path)
    out = []
    for line in path.read_text().splitlines():
        if line.startswith("RESULT ") and "part" in (result := json.loads(line[len("RESULT "):])):
            out.append(result)
        elif header := _GRID_HEADER.match(line):
            out.append({"part": "grid-setup", "copy_method": header.group(1)})
    return out


def _vllm_runs(path: Path) -> list[dict]:
    """gpu_vllm streaming's decode steps as points: {"part": "vllm", ...}."""
    try:
        runs = json.loads(path.read_text())["runs"]
    except (ValueError, KeyError, TypeError):
        return []
    # Runs from before compressed homes and the settling knob had exact homes
    # settled on the host. Compressed homes with the fused kernels turned off
    # (an A/B, recorded since 2026-12-05) are not the engine's default.
    def engine_default(r: dict) -> bool:
        return r.get("homes") != "compressed" or r.get("fused_codec", True)

    return [{"part": "vllm", "kind": "decode", "context": r["context"], "batch": 1, "homes": r.get("homes", "exact"),
             "method": "write-backs settled " + ("across steps" if r.get("settle_across_steps") else "on the host"),
             "budget_gib": r["budget_gib"], "resident": r["resident_layers"], "ratio": r["x_bound"]}
            for r in runs if isinstance(r, dict) and "x_bound" in r and engine_default(r)]


def _k(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def _point(r: dict) -> str:
    """A step's name in the goals' lines: decode 128k x4, prefill 16k x1, ..."""
    shared = f" sharing a {_k(r['shared_prefix'])} prefix" if r.get("shared_prefix") else ""
    ids = ", contiguous ids" if r.get("contiguous") else ""
    vllm = (f", {r['homes']} homes, {r['budget_gib']:g} GiB, R {r['resident']}, {r['method']}"
            if r["part"] == "vllm" else "")
    return f"{r['kind']} {_k(r['context'])} x{r['batch']}{shared}{ids}{vllm}"


def grid_table(results: list[dict]) -> str:
    rows = [
        "| step | context | batch | homes | copied by | blocks | streamed | bound: attention | bound: bus "
        "| steps | step | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r["part"] != "grid":
            continue
        kind = r["kind"] + (" (shared 16k prefix)" if r["shared_prefix"] else "")
        layout = "contiguous" if r.get("contiguous") else f"scattered, {r['mean_run_blocks']:.2f}/run"
        steps = f"{r['back_to_back']} back to back" if r.get("back_to_back") else "alone"
        rows.append(
            f"| {kind} | {_k(r['context'])} | {r['batch']} | {r.get('homes', 'block-ids')} | {r.get('method', '')} "
            f"| {layout} | {r['streamed_bytes'] / 2**30:.2f} GiB | {r['attention_ms']:.1f} ms | {r['bus_ms']:.1f} ms "
            f"| {steps} | {r['step_ms']:.1f} ms | **{r['ratio']:.3f}x** |"
        )
    return "\n".join(rows)


def _medians(rows: list[dict], key: str) -> list[tuple[dict, float, list[float]]]:
    """Rows of the same point (several runs) as one: (a row, the median of
    `key`, every sample), in the order the points first appear."""
    points: dict[tuple, list[dict]] = {}
    for r in rows:
        name = (r["part"], r["kind"], r["context"], r["batch"], r.get("shared_prefix", 0), r.get("contiguous", False),
                r.get("homes"), r.get("method"), r.get("back_to_back", 0), r.get("resident", 0), r.get("budget_gib"))
        points.setdefault(name, []).append(r)
    return [(same[0], statistics.median(r[key] for r in same), [r[key] for r in same]) for same in points.values()]


def _samples(values: list[float]) -> str:
    return "" if len(values) == 1 else f" (median of {len(values)}: {', '.join(f'{v:.3f}' for v in values)})"


def _bound_goal(title: str, rows: list[dict], most: float) -> tuple[bool | None, list[str]]:
    points = _medians(rows, "ratio")
    if not points:
        return None, [f"- {title}: **not measured** in these files"]
    missed = [(r, ratio, samples) for r, ratio, samples in points if ratio > most]
    worst = max(points, key=lambda p: p[1])
    verdict = f"**missed** at {len(missed)} of {len(points)} points" if missed else f"met at all {len(points)} points"
    lines = [f"- {title}: {verdict}; the worst {_point(worst[0])} at {worst[1]:.3f}x{_samples(worst[2])}"]
    lines += [f"  - {_point(r)}: {ratio:.3f}x{_samples(samples)}" for r, ratio, samples in missed]
    return not missed, lines


def goals(results: list[dict]) -> tuple[bool, str]:
    """Issue 21's goals against these results: (all measured ones met, the
    verdict as markdown lines, each missed point named)."""
    verdicts: list[bool | None] = []
    lines: list[str] = []
    methods = {r["copy_method"] for r in results if r["part"] == "grid-setup"}
    if len(methods) > 1:
        raise ValueError(f"these runs' grids chose different copy methods ({', '.join(sorted(methods))}): "
                         "give the goals one device's runs")
    method = next(iter(methods), None)
    # Without the grid's header no row is known to be the engine's own method.
    exact = [r for r in results if r["part"] == "grid" and r.get("homes") == "extents" and not r.get("contiguous")
             and method is not None and r.get("method") == method]
    ok, said = _bound_goal(f"exact homes, scattered ids, copied by the engine's method ({method}), "
                           f"at most {EXACT_GOAL:.2f}x the bound", exact, EXACT_GOAL)
    verdicts.append(ok)
    lines += said
    compressed = [r for r in results if r["part"] == "compressed" and r.get("method") == COMPRESSED_DEFAULT]
    ok, said = _bound_goal(f"compressed homes ({COMPRESSED_DEFAULT}), at most {COMPRESSED_GOAL:.2f}x their bound",
                           compressed, COMPRESSED_GOAL)
    verdicts.append(ok)
    lines += said
    speedups = [p for p in _medians([r for r in results if r["part"] == "compressed-speedup"
                                     and r.get("method") == COMPRESSED_DEFAULT], "speedup")
                if p[0]["kind"] == "decode" and p[0]["context"] == 131072 and not p[0].get("shared_prefix")]
    title = f"compressed homes' tokens/s at 128k decode, at least {SPEEDUP_GOAL:.1f}x exact homes'"
    if speedups:
        verdicts.append(all(speedup >= SPEEDUP_GOAL for _, speedup, _ in speedups))
        each = "; ".join(f"{_point(r)} {speedup:.3f}x{_samples(samples)}" for r, speedup, samples in speedups)
        lines.append(f"- {title}: {'met' if verdicts[-1] else '**missed**'}: {each}")
    else:
        verdicts.append(None)
        lines.append(f"- {title}: **not measured** in these files")
    ok, said = _bound_goal(f"inside vLLM, a decode step at most {VLLM_GOAL:.2f}x the bus's bound",
                           [r for r in results if r["part"] == "vllm"], VLLM_GOAL)
    verdicts.append(ok)
    lines += said
    checks = [r for r in results if r["part"] == "verify"]
    codecs = [r for r in results if r["part"] == "codec"]
    wrong = [r for r in checks if not r["ok"]]
    bad_codec = [r for r in codecs if not r["decode_bitwise"]]
    if checks or codecs:
        verdicts.append(not wrong and not bad_codec)
        lines.append(f"- every staged and written-back block bitwise its home (through the homes' codec): "
                     f"{'**missed**' if wrong or bad_codec else 'met'}: {len(checks) - len(wrong)} of {len(checks)} "
                     f"steps, the device's decode {'differs from' if bad_codec else 'equals'} the CPU's")
        lines += [f"  - {_point(r)}, {r['homes']} homes: differ" for r in wrong]
    else:
        verdicts.append(None)
        lines.append("- every staged block bitwise its home: **not measured** in these files")
    return all(v is not False for v in verdicts), "\n".join(lines)


def curve_rows(results: list[dict]) -> list[dict]:
    return [r for r in results if r["part"] == "curve"]


def curve_table(results: list[dict]) -> str:
    rows = [
        "| resident layers R | device KV (ring + resident) | host homes | step | bound | ratio | decode tokens/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in curve_rows(results):
        layers, resident = r["layers"], r["resident"]
        per_layer = r["context"] * 4096 / 2**30 * 1.0  # GiB of one layer's KV (8 heads x 128, bf16)
        ring = 0 if resident == layers else min(2, layers - resident)
        rows.append(
            f"| {resident} | {(resident + ring) * per_layer:.1f} GiB | {(layers - resident) * per_layer:.1f} GiB "
            f"| {r['step_ms']:.1f} ms | {r['bound_ms']:.1f} ms | {r['ratio']:.3f}x | {1000 / r['step_ms']:.2f} |"
        )
    return "\n".join(rows)


def compressed_table(results: list[dict]) -> str:
    """Each compressed variant's steps (and exact homes' in the same run),
    with compressed homes' tokens/s over exact homes' where the run gave it."""
    rows = [
        "| step | homes, by | streamed | bound: attention | bound: bus | step | ratio | tokens/s over exact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    speedup = {(r.get("method"), r["kind"], r["context"], r["batch"]): r["speedup"]
               for r in results if r["part"] == "compressed-speedup"}
    for r in results:
        if r["part"] != "compressed":
            continue
        over = speedup.get((r.get("method"), r["kind"], r["context"], r["batch"]))
        rows.append(
            f"| {_point(r)} | {r.get('method', 'compressed')} | {r['streamed_bytes'] / 2**30:.2f} GiB "
            f"| {r['attention_ms']:.1f} ms | {r['bus_ms']:.1f} ms | {r['step_ms']:.1f} ms | {r['ratio']:.3f}x "
            f"| {'' if over is None else f'{over:.3f}x'} |"
        )
    return "\n".join(rows)


def arc_table(results: list[dict], h2d_peak_gbs: float) -> str:
    """Decode tokens/s on an Arc Pro B60, computed from the H200's measured ratios."""
    # The H200 reaches 55 GB/s of Gen5 x16's 63: the same share of the B60's x8.
    efficiency = h2d_peak_gbs / (2 * ARC_LINK_GBS)
    arc_link = ARC_LINK_GBS * efficiency
    rows = [
        f"| context | streamed a step | H200: step (measured) | H200 tokens/s | B60: bus | B60: attention | "
        f"B60: step (computed) | B60 tokens/s (computed) | B60 tokens/s, contiguous homes (computed) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    contiguous = {r["context"]: r["ratio"] for r in results
                  if r["part"] == "grid" and r["kind"] == "decode" and r.get("contiguous")}
    best_contiguous = min(contiguous.values()) if contiguous else 1.0
    for r in results:
        if not (r["part"] == "grid" and r["kind"] == "decode" and r["batch"] == 1 and r.get("method") != "runs"
                and not r["shared_prefix"] and not r.get("contiguous")):
            continue
        bytes_ = r["streamed_bytes"]
        bus = bytes_ / (arc_link * 1e9) * 1e3
        # Attention reads the context's KV once from device memory (ideal kernel), plus the weights.
        attention = (bytes_ + WEIGHT_BYTES) / (ARC_MEMORY_GBS * 1e9) * 1e3
        bound = max(bus, attention)
        step = r["ratio"] * bound
        step_contiguous = contiguous.get(r["context"], best_contiguous) * bound
        rows.append(
            f"| {_k(r['context'])} | {bytes_ / 2**30:.1f} GiB | {r['step_ms']:.0f} ms | {1000 / r['step_ms']:.2f} "
            f"| {bus:.0f} ms | {attention:.0f} ms | {step:.0f} ms | {1000 / step:.2f} | {1000 / step_contiguous:.2f} |"
        )
    return "\n".join(rows) + (
        f"\n\nB60 link: PCIe 5.0 x8 = {ARC_LINK_GBS:.1f} GB/s raw, taken at the H200's measured share of its own "
        f"link ({efficiency:.1%}): {arc_link:.1f} GB/s. B60 memory: {ARC_MEMORY_GBS:.0f} GB/s."
    )


def plot_curve(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = curve_rows(results)
    resident = [r["resident"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot(resident, [r["step_ms"] for r in rows], "o-", label="engine (measured)")
    ax.plot(resident, [r["bound_ms"] for r in rows], "s--", label="bound: max(attention, bytes / pinned peak)")
    ax.set_xlabel("resident layers R (of 32)")
    ax.set_ylabel("decode step, ms")
    context = rows[0]["context"] if rows else 0
    ax.set_title(f"Layer streaming, {_k(context)} context, batch 1, H200 (block ids scattered)")
    twin = ax.twiny()
    twin.set_xlim(ax.get_xlim())
    ticks = [r for r in resident if r % 8 == 0]
    twin.set_xticks(ticks)
    twin.set_xticklabels([f"{(r + (2 if r < 32 else 0)) * context * 4096 / 2**30:.0f}" for r in ticks])
    twin.set_xlabel("device KV memory, GiB")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def trace_summary(path: Path) -> str:
    """Per device stream of a kineto trace (streaming_bench_profiled): busy time and its largest kernels."""
    import collections
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    start = min(e["ts"] for e in device)
    span = max(e["ts"] + e["dur"] for e in device) - start
    streams = collections.defaultdict(list)
    for e in device:
        streams[e["args"].get("stream")].append(e)
    lines = [f"{path.name}: the step's device span {span / 1e3:.1f} ms"]
    for stream, es in sorted(streams.items(), key=lambda kv: -sum(e["dur"] for e in kv[1])):
        busy = sum(e["dur"] for e in es)
        lines.append(f"  stream {stream}: busy {busy / 1e3:.1f} ms ({busy / span:.0%} of the span)")
        by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0, 0.0])
        for e in es:
            row = by_name[e["name"][:60]]
            row[0] += e["dur"]
            row[1] += 1
            row[2] += e["args"].get("memory bandwidth (GB/s)", 0) * e["dur"]
        for name, (dur, count, weighted) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:4]:
            rate = f" at {weighted / dur:.1f} GB/s" if weighted else ""
            lines.append(f"    {dur / 1e3:8.2f} ms  {count:5d} x {name}{rate}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw", type=Path, nargs="+",
                        help="streaming_bench outputs (RESULT lines are read); with --goals also gpu_vllm's JSON")
    parser.add_argument("--plot", type=Path, help="write the resident-layers curve as a PNG here")
    parser.add_argument("--trace", type=Path, nargs="*", default=[],
                        help="kineto traces of streaming_bench_profiled to summarise per stream")
    parser.add_argument("--goals", action="store_true",
                        help="only issue 21's goals, point by point; exit 1 when one is missed")
    args = parser.parse_args()
    missing = [str(path) for path in args.raw if not path.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    results = [r for path in args.raw for r in read_results(path)]
    if not any(r["part"] != "grid-setup" for r in results):
        parser.error(f"no streaming_bench RESULT lines (nor gpu_vllm streaming runs) in "
                     f"{', '.join(map(str, args.raw))}: give their output")
    if args.goals:
        try:
            met, verdict = goals(results)
        except ValueError as e:
            parser.error(str(e))
        print(f"### Issue 21's goals\n\n{verdict}")
        sys.exit(0 if met else 1)
    for trace in args.trace:
        print(trace_summary(trace) + "\n")
    peak = next((r["h2d_gbs"] for r in results if r["part"] == "peak"), 55.0)
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
