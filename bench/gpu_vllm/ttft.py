"""ttft: the first token's time of a prompt, by engine: a miss, vLLM's own
GPU prefix hit and a hit from each connector's host tier, against the bus's
bound (the package's docstring says how)."""

from __future__ import annotations

import time
from typing import Any

from pipeline.vllm_driver.llm import shutdown

from .common import ENGINES, cudagraph_mode, kv_bytes, make_llm, median_ms, pinned_peak_gbps, prompt_of, timed_generate


def ttft(lengths: list[int], repeats: int, engines: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "peak_h2d_gbps": round(pinned_peak_gbps(), 2),
        "lengths": lengths,
        "repeats": repeats,
        "engines": {},
    }
    max_len = max(lengths) + 64
    for name in engines:
        connector, extra = ENGINES[name]
        t0 = time.perf_counter()
        llm = make_llm(connector, extra, max_model_len=max_len)
        row: dict[str, Any] = {
            "start_s": round(time.perf_counter() - t0, 1),
            "cudagraph_mode": cudagraph_mode(llm),
            "by_length": {},
        }
        print(f"{name}: started in {row['start_s']} s, {row['cudagraph_mode']}", flush=True)
        timed_generate(llm, prompt_of(2048, 0), "warm-up")
        for n in lengths:
            prompt = prompt_of(n, n)
            cell: dict[str, Any] = {}
            # A miss: a fresh salt each time (with a connector it also stores).
            cell["miss_ms"] = median_ms([timed_generate(llm, prompt, f"miss-{n}-{i}") for i in range(repeats)])
            # vLLM's own GPU prefix hit on the last miss's blocks.
            cell["gpu_hit_ms"] = median_ms(
                [timed_generate(llm, prompt, f"miss-{n}-{repeats - 1}") for _ in range(repeats)]
            )
            if connector:
                hits = []
                for _ in range(repeats):
                    llm.reset_prefix_cache()
                    hits.append(timed_generate(llm, prompt, f"miss-{n}-{repeats - 1}"))
                cell["host_hit_ms"] = median_ms(hits)
            row["by_length"][str(n)] = cell
            print(f"  {name} {n}: {cell}", flush=True)
        out["engines"][name] = row
        shutdown(llm)
    peak = out["peak_h2d_gbps"] * 1e9
    for n in lengths:
        kv = kv_bytes(n)
        gpu_hit = out["engines"].get("plain", {}).get("by_length", {}).get(str(n), {}).get("gpu_hit_ms")
        out.setdefault("bounds", {})[str(n)] = {
            "kv_bytes": kv,
            "bus_ms": round(1000 * kv / peak, 2),
            "host_hit_bound_ms": None if gpu_hit is None else round(1000 * kv / peak + gpu_hit, 2),
        }
    return out
