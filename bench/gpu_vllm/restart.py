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
    path = Path(store_dir) / "activekv-bench-restart-store"
    for stale in (path, Path(f"{path}.index")):
        stale.unlink(missing_ok=True)
    # Room for every prompt twice (the restarted vLLM stores the prompts nobody
    # stored too) and the warm-ups: no eviction, so every hit is whole.
    capacity = 2 * sum(lengths) * KV_BYTES_PER_TOKEN_LAYER * LLAMA3_8B["num_hidden_layers"] + GIB
    extra = {"mode": "exact", "capacity_bytes": capacity, "store_path": str(path)}
    max_len = max(lengths) + 64
    out: dict[str, Any] = {
        "peak_h2d_gbps": round(pinned_peak_gbps(), 2),
        "lengths": lengths,
        "capacity_gib": round(capacity / GIB, 2),
        "store": str(path),
        "by_length": {},
    }
    t0 = time.perf_counter()
    llm = make_llm("ActiveKVHostConnector", extra, max_model_len=max_len)
    out["first_start_s"] = round(time.perf_counter() - t0, 1)
    try:
        timed_generate(llm, prompt_of(2048, 0), "warm-up")
        for n in lengths:
            out["by_length"][str(n)] = {
                "recompute_ms": round(1000 * timed_generate(llm, prompt_of(n, n), "restart"), 1)
            }
    finally:
        shutdown(llm)
    t0 = time.perf_counter()
    llm = make_llm("ActiveKVHostConnector", extra, max_model_len=max_len)
    out["restart_s"] = round(time.perf_counter() - t0, 1)
    try:
        timed_generate(llm, prompt_of(2048, 1), "warm-up")  # not stored before: a recompute
        for n in lengths:
            cell = out["by_length"][str(n)]
            cell["from_store_ms"] = round(1000 * timed_generate(llm, prompt_of(n, n), "restart"), 1)
            cell["recompute_after_restart_ms"] = round(1000 * timed_generate(llm, prompt_of(n, n + 1), "restart"), 1)
            kv = kv_bytes(n)
            cell["kv_gib"] = round(kv / GIB, 2)
            cell["x_faster"] = round(cell["recompute_ms"] / cell["from_store_ms"], 2)
            print(f"  restart {n}: {cell}", flush=True)
    finally:
        shutdown(llm)
    for stale in (path, Path(f"{path}.index")):
        stale.unlink(missing_ok=True)
    return out
