"""The report of a served sweep, drawn from whatever records exist.

Per workload and machine (engines are compared only within one machine's
runs), per engine and rate: requests, errors, TTFT p50/p90/p99, TPOT p50/p99,
output tokens/s and requests/s over the rate point, the share of prompt tokens
that came from vLLM's GPU prefix cache and from the connector (the host tier:
vLLM's own counters, the same definition for every peer), and how many answers
were the same as plain vLLM's. Then each ActiveKV engine against each peer
at each rate and each goal met or not (TTFT_MARGIN below), where each
engine's time went (its own counters; with `run --step-times`, vLLM's
iterations from the server's log: the steps that took in prompt tokens
against the decode-only ones), and the curves as PNGs (TTFT p50 and p99
against rate, throughput against rate).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.served.engines import ENGINES
from bench.served.runner import read_records

PEERS = ("plain", "vllm-offloading", "lmcache")


def percentile(xs: list[float], q: float) -> float | None:
    """The q-th percentile, linear between closest ranks (numpy's default)."""
    if not xs:
        return None
    xs = sorted(xs)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 1)


def summarize(
    requests: list[dict[str, Any]], counters: dict[str, float], workers: int = 1, on_gpu: bool = False
) -> dict[str, Any]:
    ok = [r for r in requests if "error" not in r]
    ttft = [r["ttft_s"] for r in ok if "ttft_s" in r]
    tpot = [r["tpot_s"] for r in ok if "tpot_s" in r]
    out: dict[str, Any] = {
        "requests": len(requests),
        "errors": len(requests) - len(ok),
        "ttft_p50_ms": _ms(percentile(ttft, 50)),
        "ttft_p90_ms": _ms(percentile(ttft, 90)),
        "ttft_p99_ms": _ms(percentile(ttft, 99)),
        "tpot_p50_ms": _ms(percentile(tpot, 50)),
        "tpot_p99_ms": _ms(percentile(tpot, 99)),
    }
    if ok:
        span = max(r["sent"] + r["latency_s"] for r in ok) - min(r["sent"] for r in requests)
        out["output_tok_s"] = round(sum(r["output_tokens"] for r in ok) / span, 1)
        out["requests_s"] = round(len(ok) / span, 3)
    queried = counters.get("vllm:prefix_cache_queries_total")
    if queried:
        out["gpu_hit_pct"] = round(100 * counters.get("vllm:prefix_cache_hits_total", 0) / queried, 1)
        out["host_hit_pct"] = round(100 * counters.get("vllm:external_prefix_cache_hits_total", 0) / queried, 1)
    by_source = {
        k.split("source=", 1)[1].rstrip("}"): v
        for k, v in counters.items()
        if k.startswith("vllm:prompt_tokens_cached_by_source_total{") and v
    }
    if by_source:  # vLLM 0.32+: the tier the connector says each hit came from
        out["cached_by_source"] = by_source
    out["preemptions"] = counters.get("vllm:num_preemptions_total")
    out["phases_ms"] = request_phases(counters)
    out["connector"] = connector_time(counters, len(requests), workers, on_gpu)
    return out


def request_phases(counters: dict[str, float]) -> dict[str, float] | None:
    """The mean time a request spent queued, in prefill (a load inside the
    step included) and in decode over the rate point, in ms, from vLLM's own
    histograms (runner.PHASE_HISTOGRAMS); None where they were not scraped."""
    out = {}
    for phase in ("queue", "prefill", "decode"):
        name = f"vllm:request_{phase}_time_seconds"
        count = counters.get(f"{name}_count")
        if count:
            out[phase] = round(1000 * counters.get(f"{name}_sum", 0.0) / count, 1)
    return out or None


def connector_time(
    counters: dict[str, float], requests: int, workers: int = 1, on_gpu: bool = False
) -> dict[str, float] | None:
    """Where ActiveKV's own time went over the rate point, from its counters:
    the workers' time on loads and saves (milliseconds a request, and on CPU
    the bytes' rate while they ran), lookups and hits. vLLM sums the workers'
    counters; the workers run side by side, so a request's time is that sum
    over the number of workers, and the rate is all workers' together. On a
    GPU the counters hold the time spent issuing copies that then run on a
    copy stream, so no rate is derived from them there. None for an engine
    without them."""
    get = lambda name: counters.get(f"vllm:activekv_{name}_total", 0.0)  # noqa: E731
    if not any(k.startswith("vllm:activekv_") for k in counters) or not requests:
        return None
    load_s, save_s, stream_s = (get(n) / 1e6 / workers for n in ("load_us", "save_us", "stream_us"))
    return {
        "load_ms_a_request": round(1000 * load_s / requests, 2),
        "load_gbps": round(get("bytes_to_device") / load_s / 1e9, 2) if load_s and not on_gpu else None,
        "save_ms_a_request": round(1000 * save_s / requests, 2),
        "save_gbps": round(get("bytes_to_host") / save_s / 1e9, 2) if save_s and not on_gpu else None,
        "stream_ms_a_request": round(1000 * stream_s / requests, 2),
        "copies_on_a_stream": on_gpu,
        "hit_tokens": get("hit_tokens"),
        "loaded_blocks": get("loaded_blocks"),
        # None from an engine that did not count them (before the counter existed).
        "async_loaded_blocks": counters.get("vllm:activekv_async_loaded_blocks_total"),
        "stored_blocks": get("stored_blocks"),
        "evicted_blocks": get("evicted_blocks"),
        "failed_loads": get("failed_loads"),
    }


# vLLM's line for one iteration under --enable-logging-iteration-details (0.26, 0.32, 0.34).
ITERATION = re.compile(
    r"Iteration\(\d+\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests, "
    r"(\d+) generation tokens, iteration elapsed time: ([\d.]+) ms(?! \(dummy\))"
)


def step_times(log: Path, start: int, end: int) -> dict[str, Any] | None:
    """vLLM's iterations logged between bytes `start` and `end` of a server's
    log, in two kinds: those that took in prompt tokens (a request admitted or
    a prefill chunk: where a connector's loads for it run when they run in the
    step) and the decode-only ones; the count, p50 and p90 of each, and the
    first kind's share of all step time. None where none was logged."""
    if not log.is_file():
        return None
    with log.open("rb") as f:
        f.seek(start)
        text = f.read(max(0, end - start)).decode(errors="replace")
    prompt, decode = [], []
    for m in ITERATION.finditer(text):
        ctx_requests, gen_requests, ms = int(m.group(1)), int(m.group(3)), float(m.group(5))
        if ctx_requests:
            prompt.append(ms)
        elif gen_requests:
            decode.append(ms)
    if not prompt and not decode:
        return None
    total = sum(prompt) + sum(decode)
    out: dict[str, Any] = {}
    for kind, steps in (("prompt", prompt), ("decode", decode)):
        out[f"{kind}_steps"] = len(steps)
        for q in (50, 90):
            ms = percentile(steps, q)  # None where there were none
            out[f"{kind}_step_p{q}_ms"] = None if ms is None else round(ms, 2)
    out["prompt_share"] = round(sum(prompt) / total, 3) if total else None
    return out


def load(records: Path) -> dict[tuple[str, str], dict[str, dict[float, dict[str, Any]]]]:
    """{(workload, machine): {engine: {rate: summary}}} from every records file."""
    table: dict[tuple[str, str], dict[str, dict[float, dict[str, Any]]]] = defaultdict(dict)
    for path in sorted(records.glob("*/*.jsonl")):
        lines = read_records(path)
        runs = [r for r in lines if r["type"] == "run"]
        if not runs:
            continue
        engine, workload = runs[-1]["engine"], runs[-1]["workload"]["name"]
        device = runs[-1]["machine"].get("device", "?")
        # Records before the runner wrote "cuda" name a CUDA device by its name.
        on_gpu = runs[-1]["machine"].get("cuda", device.startswith("NVIDIA"))
        by_rate: dict[float, list[dict[str, Any]]] = defaultdict(list)
        for r in lines:
            if r["type"] == "request" and r["phase"] == "measured":
                by_rate[r["rate"]].append(r)
        points = {}
        for p in (r for r in lines if r["type"] == "point"):
            points[p["rate"]] = summarize(by_rate[p["rate"]], p["counters"], runs[-1].get("workers", 1), on_gpu)
            points[p["rate"]]["_answers"] = {_key(r): r.get("output_sha") for r in by_rate[p["rate"]]}
            if "server_log" in p:
                points[p["rate"]]["steps"] = step_times(path.with_suffix(".server.log"), *p["server_log"])
        table[(workload, device)][engine] = points
    order = list(ENGINES)
    for key, engines in table.items():  # engines in engines.py's order
        table[key] = dict(
            sorted(engines.items(), key=lambda e: (order.index(e[0]) if e[0] in order else len(order), e[0]))
        )
    for engines in table.values():
        plain = engines.get("plain", {})
        for name, points in engines.items():
            for rate, s in points.items():
                theirs = plain.get(rate, {}).get("_answers")
                mine = s["_answers"]
                if name != "plain" and theirs:
                    common = [k for k in mine if k in theirs and mine[k] and theirs[k]]
                    s["same_answers"] = f"{sum(mine[k] == theirs[k] for k in common)}/{len(common)}"
    for engines in table.values():
        for points in engines.values():
            for s in points.values():
                s.pop("_answers")
    return table


def _key(r: dict[str, Any]) -> tuple:
    return (r.get("user"), r.get("turn"), r.get("doc"), r.get("index"))


COLUMNS = [
    ("rate", "rate/s"),
    ("requests", "req"),
    ("errors", "err"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p90_ms", "p90"),
    ("ttft_p99_ms", "p99"),
    ("tpot_p50_ms", "TPOT p50 ms"),
    ("tpot_p99_ms", "p99"),
    ("output_tok_s", "out tok/s"),
    ("requests_s", "req/s"),
    ("gpu_hit_pct", "GPU hit %"),
    ("host_hit_pct", "host hit %"),
    ("preemptions", "preempt"),
    ("same_answers", "same as plain"),
]


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _connector_note(c: dict[str, Any]) -> str:
    rates = not c["copies_on_a_stream"]  # on CPU the time is the copies' own
    return (
        f"its workers' time: loads {c['load_ms_a_request']} ms a "
        + (f"request ({c['load_gbps']} GB/s while loading)" if rates else "request issuing copies")
        + f", saves {c['save_ms_a_request']} ms"
        + (f" ({c['save_gbps']} GB/s)" if rates else "")
        + f", streaming {c['stream_ms_a_request']} ms; "
        f"{c['hit_tokens']:.0f} tokens hit, {c['loaded_blocks']:.0f} blocks loaded"
        + (f" ({c['async_loaded_blocks']:.0f} asynchronously)" if c["async_loaded_blocks"] is not None else "")
        + f", {c['stored_blocks']:.0f} blocks stored, "
        f"{c['evicted_blocks']:.0f} evicted, {c['failed_loads']:.0f} failed loads"
    )


def _phases_note(phases: dict[str, float]) -> str:
    return "a request's time in vLLM (means): " + ", ".join(f"{phase} {ms} ms" for phase, ms in phases.items())


def _steps_note(t: dict[str, Any]) -> str:
    return (
        f"vLLM's steps: {t['decode_steps']} decode-only, "
        f"p50 {t['decode_step_p50_ms']} ms, p90 {t['decode_step_p90_ms']} ms; "
        f"{t['prompt_steps']} taking in prompt tokens, p50 {t['prompt_step_p50_ms']} ms, "
        f"p90 {t['prompt_step_p90_ms']} ms ({100 * (t['prompt_share'] or 0):.0f}% of step time)"
    )


def markdown(table) -> str:
    out = []
    for (workload, device), engines in sorted(table.items()):
        out.append(f"### {workload} on {device}\n")
        out.append("| engine | " + " | ".join(h for _, h in COLUMNS) + " |")
        out.append("|---|" + "---|" * len(COLUMNS))
        for engine, points in engines.items():
            for rate, s in sorted(points.items()):
                row = {**s, "rate": rate}
                out.append(f"| {engine} | " + " | ".join(_cell(row.get(k)) for k, _ in COLUMNS) + " |")
        out.append("")
        out.extend(against_peers(engines, workload))
        for key, describe in (("connector", _connector_note), ("phases_ms", _phases_note), ("steps", _steps_note)):
            for engine, points in engines.items():
                for rate, s in sorted(points.items()):
                    if s.get(key):
                        out.append(f"- {engine} at {rate:g}/s, " + describe(s[key]))
        out.append("")
    return "\n".join(out)


# The goals each ActiveKV engine is held to, at every rate (BENCHMARKS.md,
# "Served under load"): below every peer's TTFT p50 and p99, and 1.5x below
# the best peer's where the host tier serves most prompt tokens; throughput
# at least the best peer's. Where everything fits the GPU's KV (the "-fits"
# workloads), within 2% of plain vLLM on every figure.
TTFT_MARGIN = 1.5
FITS_TOLERANCE = 0.02
FITS_FIGURES = (("ttft_p50_ms", min), ("ttft_p99_ms", min), ("tpot_p50_ms", min), ("output_tok_s", max))


def against_peers(engines: dict[str, dict[float, dict[str, Any]]], workload: str = "") -> list[str]:
    """Each ActiveKV engine against each peer at each rate (ActiveKV's figure
    over the peer's: below 1 is ActiveKV ahead on TTFT, above 1 on
    throughput), and each goal met or not."""
    lines = []
    peers = {n: p for n, p in engines.items() if n in PEERS}
    for name, points in engines.items():
        if not name.startswith("activekv") or not peers:
            continue
        for rate, s in sorted(points.items()):
            there = {n: p[rate] for n, p in peers.items() if rate in p}
            if not there:
                continue
            ratios = []
            for key in ("ttft_p50_ms", "ttft_p99_ms", "output_tok_s"):
                each = [f"{s[key] / t[key]:.2f}x {n}" for n, t in there.items() if s.get(key) and t.get(key)]
                if each:
                    ratios.append(f"{key.replace('_ms', '')} " + ", ".join(each))
            lines.append(f"- {name} at {rate:g}/s against each peer: " + "; ".join(ratios))
            verdicts = fits_goal(s, there) if workload.endswith("-fits") else goals(s, there)
            lines.append("  goals: " + "; ".join(verdicts))
    return lines


def _verdict(met: bool | None, what: str) -> str:
    return f"{what}: " + ("met" if met else "not met" if met is not None else "no figure")


def goals(s: dict[str, Any], peers: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    for key in ("ttft_p50_ms", "ttft_p99_ms"):
        theirs = [t[key] for t in peers.values() if t.get(key)]
        ours = s.get(key)
        label = key.replace("_ms", "")
        if not theirs or not ours:
            out.append(_verdict(None, f"{label} below every peer's"))
            continue
        out.append(_verdict(ours < min(theirs), f"{label} below every peer's"))
        if (s.get("host_hit_pct") or 0) > 50:
            out.append(
                _verdict(
                    min(theirs) / ours >= TTFT_MARGIN,
                    f"{label} {TTFT_MARGIN}x below the best peer's ({min(theirs) / ours:.2f}x)",
                )
            )
    theirs = [t["output_tok_s"] for t in peers.values() if t.get("output_tok_s")]
    ours = s.get("output_tok_s")
    out.append(_verdict(ours >= max(theirs) if ours and theirs else None, "throughput at least the best peer's"))
    return out


def fits_goal(s: dict[str, Any], peers: dict[str, dict[str, Any]]) -> list[str]:
    plain = peers.get("plain")
    if not plain:
        return [_verdict(None, "within 2% of plain vLLM (no plain run at this rate)")]
    off = []
    for key, better in FITS_FIGURES:
        ours, theirs = s.get(key), plain.get(key)
        if not ours or not theirs:
            off.append(f"{key} missing")
        elif (ours / theirs - 1 if better is min else 1 - ours / theirs) > FITS_TOLERANCE:
            off.append(f"{key.replace('_ms', '')} {ours / theirs:.3f}x")
    what = f"within {FITS_TOLERANCE:.0%} of plain vLLM on every figure"
    return [_verdict(not off, what + (f" ({', '.join(off)})" if off else ""))]


def plot(table, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for (workload, device), engines in sorted(table.items()):
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        for engine, points in engines.items():
            rates = sorted(points)
            for ax, key in zip(axes, ("ttft_p50_ms", "ttft_p99_ms", "output_tok_s"), strict=True):
                ys = [points[r].get(key) for r in rates]
                ax.plot(rates, [float("nan") if y is None else y for y in ys], marker="o", label=engine)
        for ax, title in zip(axes, ("TTFT p50 (ms)", "TTFT p99 (ms)", "output tokens/s"), strict=True):
            ax.set_xlabel("request rate (requests/s)")
            ax.set_title(title)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{workload} on {device}")
        fig.tight_layout()
        path = out_dir / f"served-{workload}-{device.replace(' ', '-')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
