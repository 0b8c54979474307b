"""Tables (and the resident-layers plot) for the benchmark record from streaming_bench's raw output.

streaming_bench (engine/bench/streaming/) prints a ``RESULT {json}``
line per measured point. This reads them back and prints the markdown tables
docs/benchmarks/history.md quotes, including the Arc Pro B60 table, which is *computed*
from the H200's measured ratios and the card's published link and memory
figures, never measured.

    python -m bench.gpu_report bench/raw/<run>.txt [--plot PNG] [--trace TRACE.json.gz ...]
    python -m bench.gpu_report --goals bench/raw/<grid>.txt bench/raw/<compressed>.txt

--goals says, point by point, whether the layer-streaming goals are met by the runs
given (several runs of a point: their median). It also reads
`python -m bench.gpu_vllm streaming --out X.json`'s JSON for the goal
inside vLLM. Exit 0: every goal measured and met; 1: one missed; 3: none
missed, some not measured; 2: input it cannot read.

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


# The layer-streaming goals. Exact homes: every point with scattered ids at most 1.05x
# its bound, copied by the engine's own method. Compressed homes, by the
# engine's default on CUDA (fused codec kernels, batched copies): at most 1.10x
# their bound, and at least 1.6x exact homes' tokens/s at 128k decode. Inside
# vLLM (bench.gpu_vllm streaming's JSON): a decode step at most 1.10x
# the bus's bound, exact and compressed homes alike.
EXACT_GOAL = 1.05
COMPRESSED_GOAL = 1.10
SPEEDUP_GOAL = 1.6
VLLM_GOAL = 1.10
COMPRESSED_DEFAULT = "compressed-fused-batch"

# The grid's header names the copy method the engine chose on the device.
_GRID_HEADER = re.compile(r"^grid: .*, copy method (\S+)$")
# What a run measured; every other field of a point says which point it is.
_MEASURED = {"step_ms", "attention_ms", "bus_ms", "bound_ms", "ratio", "h2d_peak_gbs", "host_ms", "speedup", "ok"}


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
        elif header := _GRID_HEADER.match(line):
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


def _k(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def _point(r: dict) -> str:
    """A point's name in the goals' lines, with every setting that makes it
    another point: decode 128k x4, 8 back to back; prefill 16k x1, alone; ..."""
    name = f"{r['kind']} {_k(r['context'])} x{r['batch']}"
    if r.get("shared_prefix"):
        name += f" sharing a {_k(r['shared_prefix'])} prefix"
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
        points.setdefault(tuple(sorted((k, v) for k, v in r.items() if k not in _MEASURED)), []).append(r)
    return [(same[0], statistics.median(r[key] for r in same), [r[key] for r in same]) for same in points.values()]


def _samples(values: list[float]) -> str:
    return "" if len(values) == 1 else f" (median of {len(values)}: {', '.join(f'{v:.3f}' for v in values)})"


def _gpu(r: dict) -> str:
    return r.get("gpu") or "a GPU its file does not name"


def _on(rows: list[dict]) -> str:
    """Which GPUs the rows were measured on: the goals name the H200, and an
    H100's figures differ."""
    return " on " + " and ".join(sorted({_gpu(r) for r in rows}))


def _goal(title: str, rows: list[dict], key: str, limit: float, at_most: bool = True) -> tuple[bool | None, list[str]]:
    """(met, lines): every point's median of `key` at most (or at least) `limit`;
    None when no row measured it."""
    points = _medians(rows, key)
    if not points:
        return None, [f"- {title}: **not measured** in these files"]
    missed = [p for p in points if (p[1] > limit if at_most else p[1] < limit)]
    worst = (max if at_most else min)(points, key=lambda p: p[1])
    counted = "the one point" if len(points) == 1 else f"all {len(points)} points"
    verdict = f"**missed** at {len(missed)} of {len(points)} points" if missed else f"met at {counted}"
    # Runs of one GPU pool into a point; where the rows span several GPUs, a
    # point says its own.
    several = len({r.get("gpu") for r in rows}) > 1

    def name(r):
        return _point(r) + (f", {_gpu(r)}" if several else "")

    lines = [f"- {title}: {verdict}{_on(rows)}; the worst {name(worst[0])}: {worst[1]:.3f}x{_samples(worst[2])}"]
    lines += [f"  - {name(r)}: {value:.3f}x{_samples(samples)}" for r, value, samples in missed]
    return not missed, lines


def goals(results: list[dict]) -> tuple[bool | None, str]:
    """The layer-streaming goals against these results: (True when every goal is
    measured and met, False when one is missed, None when none is missed but
    some are not measured; the verdict as markdown lines, each missed point
    named). Raises BadRun when the grid's rows cannot be judged."""
    methods = {r["copy_method"] for r in results if r["part"] == "grid-setup"}
    if len(methods) > 1:
        raise BadRun(
            f"these runs' grids chose different copy methods ({', '.join(sorted(methods))}): "
            "give runs of one device and one engine"
        )
    grid = [r for r in results if r["part"] == "grid"]
    if grid and not methods:
        raise BadRun(
            "grid rows without the grid's header ('grid: ... copy method X'), which names the engine's "
            "own method: give streaming_bench's whole output"
        )
    method = next(iter(methods), "")
    said = [
        _goal(
            f"exact homes, scattered ids, copied by the engine's method{' ' + method if method else ''}, "
            f"at most {EXACT_GOAL:.2f}x the bound",
            [r for r in grid if r.get("homes") == "extents" and not r.get("contiguous") and r.get("method") == method],
            "ratio",
            EXACT_GOAL,
        ),
        _goal(
            f"compressed homes ({COMPRESSED_DEFAULT}), at most {COMPRESSED_GOAL:.2f}x their bound",
            [r for r in results if r["part"] == "compressed" and r.get("method") == COMPRESSED_DEFAULT],
            "ratio",
            COMPRESSED_GOAL,
        ),
        _goal(
            f"compressed homes' tokens/s at 128k decode, at least {SPEEDUP_GOAL:.1f}x exact homes'",
            [
                r
                for r in results
                if r["part"] == "compressed-speedup"
                and r.get("method") == COMPRESSED_DEFAULT
                and r["kind"] == "decode"
                and r["context"] == 131072
            ],
            "speedup",
            SPEEDUP_GOAL,
            at_most=False,
        ),
        _goal(
            f"inside vLLM, a decode step at most {VLLM_GOAL:.2f}x the bus's bound",
            [r for r in results if r["part"] == "vllm"],
            "ratio",
            VLLM_GOAL,
        ),
        _bytes_goal(results),
    ]
    lines = [line for _, goal_lines in said for line in goal_lines]
    left_out: dict[str, int] = {}
    for r in results:
        if r["part"] == "left-out":
            left_out[r["why"]] = left_out.get(r["why"], 0) + 1
    lines += [f"- left out: {n} vLLM run{'s' if n > 1 else ''}, {why}" for why, n in left_out.items()]
    verdicts = [met for met, _ in said]
    met = False if False in verdicts else None if None in verdicts else True
    return met, "\n".join(lines)


def _bytes_goal(results: list[dict]) -> tuple[bool | None, list[str]]:
    title = "every staged and written-back block bitwise its home (through the homes' codec)"
    checks = [r for r in results if r["part"] == "verify"]
    codecs = [r for r in results if r["part"] == "codec"]
    if not checks and not codecs:
        return None, [f"- {title}: **not measured** in these files"]
    wrong = [r for r in checks if not r["ok"]]
    codec_wrong = [r for r in codecs if not r["decode_bitwise"]]
    said = f"{len(checks) - len(wrong)} of {len(checks)} steps"
    if codecs:
        said += f"; the device's decode {'differs from' if codec_wrong else 'equals'} the CPU's"
    lines = [f"- {title}: {'**missed**' if wrong or codec_wrong else 'met'}: {said}"]
    lines += [f"  - {r['kind']} {_k(r['context'])} x{r['batch']}, {r['homes']} homes: differ" for r in wrong]
    return not wrong and not codec_wrong, lines


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
