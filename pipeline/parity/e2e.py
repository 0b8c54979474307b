"""End-to-end cells: the same workload in vLLM on each engine; generated tokens,
their logprobs and the bytes of every block in the workers' host stores must
be equal. The tiny model's greedy tokens hardly depend on the KV cache (it is
shaped for clear margins: pipeline/vllm_driver/tiny_model.py), its logprobs do: they gate
bitwise where the reference's two runs agree on them, as the replays do."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

from ..vllm_driver import comparison
from ..vllm_driver import llm as h
from .cells import Cell


def store_digests(worker) -> list[str]:
    """Runs inside a vLLM worker (collective_rpc): SHA-256 of every stored block."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    from .replay import store_bytes

    return sorted(store_bytes(get_kv_transfer_group()).values())


def _workload(llm) -> list[comparison.Result]:
    rng = random.Random(200)
    shared = h.random_tokens(rng, 4 * h.BLOCK_SIZE)
    prompts = [shared + h.random_tokens(rng, n) for n in (5, 70, 300)]
    prompts += [h.random_tokens(rng, n) for n in (33, 2048 + 9)]
    results = h.generate(llm, prompts)
    h.flush_device_cache(llm)
    return results + h.generate(llm, prompts)  # served from the host store


IMPLEMENTATIONS = ("reference", "reference", "native")  # the reference twice: what of it is stable
VLLM_STARTS = len(IMPLEMENTATIONS)


def run(model: Path, mode: str) -> Cell:
    # collective_rpc sends a function to the workers: vLLM pickles it only when allowed.
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    results = []
    for impl in IMPLEMENTATIONS:
        llm = h.make_llm(model, {"mode": mode}, connector=impl)
        try:
            generated = _workload(llm)
            digests = [d for per_worker in llm.collective_rpc(store_digests) for d in per_worker]
        finally:
            h.shutdown(llm)
        results.append((generated, sorted(digests)))
    (ref, ref_store), (again, _), (nat, nat_store) = results
    tokens = [r.tokens for r in ref]
    self_diff = comparison.difference(ref, again)
    detail = ""
    if tokens != [r.tokens for r in nat]:
        detail = "generated tokens differ"
    elif ref_store != nat_store:
        detail = f"host stores differ ({len(ref_store)} vs {len(nat_store)} blocks)"
    elif not self_diff and (diff := comparison.difference(ref, nat)):
        detail = f"logprobs differ: {diff}"
    digest = hashlib.sha256("".join(ref_store).encode()).hexdigest()[:12]
    note = f"{len(ref_store)} blocks, store {digest}; logprobs " + (
        "gated" if not self_diff else f"not gated (the reference's two runs differ: {self_diff})"
    )
    return Cell(
        mode, "end to end in vLLM", True, "FAIL" if detail else "pass", len(tokens) + len(ref_store), note, detail
    )
