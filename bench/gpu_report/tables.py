"""The markdown tables (and the resident-layers plot) docs/benchmarks/history.md quotes."""

from __future__ import annotations

import json
from pathlib import Path

from .results import point_name, tokens_k

# Arc Pro B60 (BMG-G21): PCIe 5.0 x8, 24 GB GDDR6 on a 192-bit bus at 456 GB/s
# (technical.city's specification table of the card). PCIe 5.0 carries 32 GT/s
# a lane with 128b/130b coding: 31.5 GB/s for x8 before protocol overhead.
ARC_LINK_GBS = 32 * 8 * 128 / 130 / 8
ARC_MEMORY_GBS = 456.0
# Llama-3-8B in bf16: what a decode step reads besides the KV cache.
WEIGHT_BYTES = 16.06e9


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
            f"| {kind} | {tokens_k(r['context'])} | {r['batch']} | {r.get('homes', 'block-ids')} "
            f"| {r.get('method', '')} "
            f"| {layout} | {r['streamed_bytes'] / 2**30:.2f} GiB | {r['attention_ms']:.1f} ms | {r['bus_ms']:.1f} ms "
            f"| {steps} | {r['step_ms']:.1f} ms | **{r['ratio']:.3f}x** |"
        )
    return "\n".join(rows)


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
    speedup = {
        (r.get("method"), r["kind"], r["context"], r["batch"]): r["speedup"]
        for r in results
        if r["part"] == "compressed-speedup"
    }
    for r in results:
        if r["part"] != "compressed":
            continue
        over = speedup.get((r.get("method"), r["kind"], r["context"], r["batch"]))
        rows.append(
            f"| {point_name(r)} | {r.get('method', 'compressed')} | {r['streamed_bytes'] / 2**30:.2f} GiB "
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
        "| context | streamed a step | H200: step (measured) | H200 tokens/s | B60: bus | B60: attention | "
        "B60: step (computed) | B60 tokens/s (computed) | B60 tokens/s, contiguous homes (computed) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    contiguous = {
        r["context"]: r["ratio"]
        for r in results
        if r["part"] == "grid" and r["kind"] == "decode" and r.get("contiguous")
    }
    best_contiguous = min(contiguous.values()) if contiguous else 1.0
    for r in results:
        if not (
            r["part"] == "grid"
            and r["kind"] == "decode"
            and r["batch"] == 1
            and r.get("method") != "runs"
            and not r["shared_prefix"]
            and not r.get("contiguous")
        ):
            continue
        bytes_ = r["streamed_bytes"]
        bus = bytes_ / (arc_link * 1e9) * 1e3
        # Attention reads the context's KV once from device memory (ideal kernel), plus the weights.
        attention = (bytes_ + WEIGHT_BYTES) / (ARC_MEMORY_GBS * 1e9) * 1e3
        bound = max(bus, attention)
        step = r["ratio"] * bound
        step_contiguous = contiguous.get(r["context"], best_contiguous) * bound
        rows.append(
            f"| {tokens_k(r['context'])} | {bytes_ / 2**30:.1f} GiB | {r['step_ms']:.0f} ms "
            f"| {1000 / r['step_ms']:.2f} "
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
    ax.set_title(f"Layer streaming, {tokens_k(context)} context, batch 1, H200 (block ids scattered)")
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
