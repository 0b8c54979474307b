"""End-to-end cells: the same workload in vLLM on each engine; generated tokens
and the bytes of every block in the workers' host stores must be equal."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

from .. import vllm_harness as h
from .cells import Cell


def store_digests(worker) -> list[str]:
    """Runs inside a vLLM worker (collective_rpc): SHA-256 of every stored block."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    from .replay import store_bytes

    return sorted(store_bytes(get_kv_transfer_group()).values())


def _workload(llm) -> list[tuple[int, ...]]:
    rng = random.Random(200)
    shared = h.random_tokens(rng, 4 * h.BLOCK_SIZE)
    prompts = [shared + h.random_tokens(rng, n) for n in (5, 70, 300)]
    prompts += [h.random_tokens(rng, n) for n in (33, 2048 + 9)]
    tokens = [r.tokens for r in h.generate(llm, prompts)]
    h.flush_device_cache(llm)
    tokens += [r.tokens for r in h.generate(llm, prompts)]  # served from the host store
    return tokens


def run(model: Path, mode: str) -> Cell:
    # collective_rpc sends a function to the workers: vLLM pickles it only when allowed.
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    results = {}
    for impl in ("reference", "native"):
        llm = h.make_llm(model, {"mode": mode}, connector=impl)
        try:
            tokens = _workload(llm)
            digests = [d for per_worker in llm.collective_rpc(store_digests) for d in per_worker]
        finally:
            h.shutdown(llm)
        results[impl] = (tokens, digests)
    (ref_tokens, ref_store), (nat_tokens, nat_store) = results["reference"], results["native"]
    detail = ""
    if ref_tokens != nat_tokens:
        detail = "generated tokens differ"
    elif ref_store != nat_store:
        detail = f"host stores differ ({len(ref_store)} vs {len(nat_store)} blocks)"
    digest = hashlib.sha256("".join(ref_store).encode()).hexdigest()[:12]
    return Cell(mode, "end to end in vLLM", True, "FAIL" if detail else "pass",
                len(ref_tokens) + len(ref_store), f"{len(ref_store)} blocks, store {digest}",
                detail)
