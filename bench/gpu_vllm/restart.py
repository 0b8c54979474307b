"""restart: the first request after a restart, served from the store file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pipeline.vllm_driver.llm import shutdown

from .common import (
    GIB,
    KV_BYTES_PER_TOKEN_LAYER,
    LLAMA3_8B,
    kv_bytes,
    make_llm,
    pinned_peak_gbps,
    prompt_of,
    timed_generate,
)


def restart(lengths: list[int], store_dir: str) -> dict[str, Any]:
    """Per length, one prompt's first token from the host store, measured the
    same way on the store file after a restart and on the in-memory store (a
    vLLM without store_path), in one run: each hit follows a hit of another
    stored prompt of the same length (its twin), so neither pays the load
    path's first use at that size (device buffers, kernels). The twin's hit
    right after the restart is reported too: what a restarted server's first
    request of that size costs."""
    path = Path(store_dir) / "activekv-bench-restart-store"
    for stale in (path, Path(f"{path}.index")):
        stale.unlink(missing_ok=True)
    # Room for every prompt, its twin and the restarted vLLM's recompute (it
    # stores that prompt too) and the warm-ups: no eviction, so every hit is whole.
    capacity = 3 * sum(lengths) * KV_BYTES_PER_TOKEN_LAYER * LLAMA3_8B["num_hidden_layers"] + GIB
    in_memory = {"mode": "exact", "capacity_bytes": capacity}
    on_file = {**in_memory, "store_path": str(path)}
    max_len = max(lengths) + 64
    out: dict[str, Any] = {
        "peak_h2d_gbps": round(pinned_peak_gbps(), 2),
        "lengths": lengths,
        "capacity_gib": round(capacity / GIB, 2),
        "store": str(path),
        "by_length": {str(n): {"kv_gib": round(kv_bytes(n) / GIB, 2)} for n in lengths},
    }
    cells = out["by_length"]
    # The in-memory store: stored, then each prompt's hit after its twin's.
    llm = make_llm("ActiveKVHostConnector", in_memory, max_model_len=max_len)
    try:
        store_prompts(llm, lengths)
        for n in lengths:
            cells[str(n)]["in_memory_hit_ms"] = hit_after_twin_ms(llm, n)
    finally:
        shutdown(llm)
    # The store file: filled, then read back by a restarted vLLM.
    t0 = time.perf_counter()
    llm = make_llm("ActiveKVHostConnector", on_file, max_model_len=max_len)
    out["first_start_s"] = round(time.perf_counter() - t0, 1)
    try:
        for n, recompute_ms in store_prompts(llm, lengths).items():
            cells[str(n)]["recompute_ms"] = recompute_ms
    finally:
        shutdown(llm)
    t0 = time.perf_counter()
    llm = make_llm("ActiveKVHostConnector", on_file, max_model_len=max_len)
    out["restart_s"] = round(time.perf_counter() - t0, 1)
    try:
        timed_generate(llm, prompt_of(2048, 1), "warm-up")  # not stored before: a recompute
        for n in lengths:
            cell = cells[str(n)]
            cell["from_file_first_ms"] = round(1000 * timed_generate(llm, twin_of(n), "restart"), 1)
            cell["from_file_ms"] = hit_after_twin_ms(llm, n)
            cell["recompute_after_restart_ms"] = round(1000 * timed_generate(llm, prompt_of(n, n + 1), "restart"), 1)
            cell["x_in_memory"] = round(cell["from_file_ms"] / cell["in_memory_hit_ms"], 3)
            cell["x_faster"] = round(cell["recompute_ms"] / cell["from_file_ms"], 2)
            print(f"  restart {n}: {cell}", flush=True)
    finally:
        shutdown(llm)
    for stale in (path, Path(f"{path}.index")):
        stale.unlink(missing_ok=True)
    return out


def store_prompts(llm, lengths: list[int]) -> dict[int, float]:
    """After a warm-up, each length's prompt and its twin computed and so
    stored: {length: the prompt's recompute in ms}."""
    timed_generate(llm, prompt_of(2048, 0), "warm-up")
    recompute_ms = {}
    for n in lengths:
        recompute_ms[n] = round(1000 * timed_generate(llm, prompt_of(n, n), "restart"), 1)
        timed_generate(llm, twin_of(n), "restart")
    return recompute_ms


def twin_of(n: int) -> list[int]:
    """Another prompt of `n` tokens, stored beside prompt_of(n, n): its hit
    warms the load path at that size."""
    return prompt_of(n, 1_000_000 + n)


def hit_after_twin_ms(llm, n: int) -> float:
    """prompt_of(n, n)'s first token from the host store (vLLM's own prefix
    cache emptied), right after its twin's."""
    llm.reset_prefix_cache()
    timed_generate(llm, twin_of(n), "restart")
    llm.reset_prefix_cache()
    return round(1000 * timed_generate(llm, prompt_of(n, n), "restart"), 1)
