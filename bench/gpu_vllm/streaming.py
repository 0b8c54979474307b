"""streaming: the decode step with layer streaming in a device KV budget,
against the bus's bound and plain vLLM with all KV on the device."""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from pipeline.vllm_driver.llm import shutdown

from . import common
from .common import (
    GIB,
    KV_BYTES_PER_TOKEN_LAYER,
    LLAMA3_8B,
    cudagraph_mode,
    decode_steps,
    make_llm,
    pinned_peak_gbps,
    prompt_of,
    timed_generate,
)


# Resident layers per budget: the homes of the streamed layers hold every
# device block (blocks x streamed layers x page of host memory, plus the
# rows' slack), and the GPU machine has 128 GiB: both budgets then hold 16384
# blocks (262,144 tokens). --resident-layers overrides (R = 0 for the longest
# contexts: a 5.5 GiB budget then holds 45,056 blocks, 720k tokens, whose
# exact homes take 93.5 GiB).
STREAMING_GEOMETRY = {4: {"resident_layers": 2, "ring_size": 2}, 16: {"resident_layers": 14, "ring_size": 2}}


def home_bytes(homes: str) -> int:
    """Host bytes of one layer's block in the homes, as the codec lays them out."""
    import torch

    from pipeline.vllm_driver import llm as h

    h.reference_on_path()
    from activekv_reference.codec import layer_bytes

    return layer_bytes(homes, common.BLOCK * KV_BYTES_PER_TOKEN_LAYER // 2, torch.bfloat16, LLAMA3_8B["head_dim"])


def streaming(
    budgets_gib: list[float],
    contexts: list[int],
    decode_tokens: int,
    repeats: int,
    homes: list[str],
    resident_layers: int | None = None,
    with_plain: bool = True,
    async_scheduling: bool | None = None,
    settle: list[bool] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"peak_h2d_gbps": round(pinned_peak_gbps(), 2), "runs": []}
    settings = settle or [os.environ.get("ACTIVEKV_SETTLE_ACROSS_STEPS") != "0"]
    peak = out["peak_h2d_gbps"] * 1e9
    layers = LLAMA3_8B["num_hidden_layers"]
    page = common.BLOCK * KV_BYTES_PER_TOKEN_LAYER
    for budget in budgets_gib:
        geometry = dict(STREAMING_GEOMETRY.get(budget, {"resident_layers": 0, "ring_size": 2}))
        if resident_layers is not None:
            geometry["resident_layers"] = resident_layers
        budget_bytes = int(budget * GIB)
        regions = geometry["resident_layers"] + geometry["ring_size"]
        expected_blocks = budget_bytes // (regions * page)
        longest = (expected_blocks - 2) * common.BLOCK
        max_len = max(contexts) + decode_tokens + 64 if 0 not in contexts else longest
        for kind, settled in [(k, on) for k in homes for on in settings]:
            config = {**geometry, "homes": kind}
            block_bytes = home_bytes(kind)
            # Read by each worker at start-up (vLLM's engine process inherits it).
            os.environ["ACTIVEKV_SETTLE_ACROSS_STEPS"] = "1" if settled else "0"
            t0 = time.perf_counter()
            llm = make_llm(
                "ActiveKVHostConnector",
                {"streaming": config, "capacity_bytes": 1 * GIB},
                max_model_len=max_len,
                kv_cache_bytes=budget_bytes,
                async_scheduling=async_scheduling,
            )
            start_s = round(time.perf_counter() - t0, 1)
            blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
            run = {
                "budget_gib": budget,
                **config,
                "start_s": start_s,
                "device_blocks": blocks,
                "serves_tokens": (blocks - 1) * common.BLOCK,
                "plain_serves_tokens": (budget_bytes // (layers * page) - 1) * common.BLOCK,
                "cudagraph_mode": cudagraph_mode(llm),
                "async_scheduling": bool(llm.llm_engine.vllm_config.scheduler_config.async_scheduling),
                "settle_across_steps": settled,
                # The A/B against ATen's operations turns compressed homes' fused
                # kernels off; kernels that failed to compile show only in the
                # worker's start-up line.
                "fused_codec_turned_off": os.environ.get("ACTIVEKV_FUSED_CODEC") == "0",
            }
            for n in contexts:
                if n == 0:  # the longest context the budget serves
                    n = (blocks - 2) * common.BLOCK - decode_tokens
                streamed = (layers - geometry["resident_layers"]) * -(-n // common.BLOCK) * block_bytes
                measured = {**run, **decode_at(llm, n, decode_tokens, repeats, bus_bound_s=streamed / peak)}
                out["runs"].append(measured)
                print(json.dumps(measured), flush=True)
            shutdown(llm)
    # Plain vLLM's decode step with all KV on the device, at the same contexts.
    plain_contexts = [n for n in contexts if n] if with_plain else []
    if plain_contexts:  # the longest contexts only: plain vLLM cannot hold them
        out.update(plain_decode(plain_contexts, decode_tokens, repeats, async_scheduling))
    return out


def decode_at(llm, n: int, decode_tokens: int, repeats: int, *, bus_bound_s: float) -> dict[str, Any]:
    """A context of `n` tokens: its prefill, its first prefix hit, and the
    median decode step over `repeats` (each from a prefix hit), against the
    bus's bound for the bytes a step streams."""
    prompt = prompt_of(n - decode_tokens, 7 + n)
    first = timed_generate(llm, prompt, f"s{n}", 1)  # prefill (+ 1 token)
    first_hit = timed_generate(llm, prompt, f"s{n}", 1)  # settles the prefill's leftovers
    ones, steps = decode_steps(llm, prompt, f"s{n}", decode_tokens, repeats)  # prefix hits
    one, step = statistics.median(ones), statistics.median(steps)
    measured = {
        "context": n,
        "prefill_s": round(first, 2),
        "first_hit_ms": round(1000 * first_hit, 2),
        "hit_ms": round(1000 * one, 2),
        "decode_step_ms": round(1000 * step, 2),
        "decode_step_samples_ms": [round(1000 * x, 2) for x in steps],
        "tokens_per_s": round(1 / step, 2),
        "bus_bound_ms": round(1000 * bus_bound_s, 2),
    }
    measured["x_bound"] = round(measured["decode_step_ms"] / measured["bus_bound_ms"], 3)
    return measured


def plain_decode(contexts: list[int], decode_tokens: int, repeats: int, async_scheduling: bool | None) -> dict:
    """Plain vLLM's median decode step with all KV on the device, per context."""
    llm = make_llm(None, None, max_model_len=max(contexts) + decode_tokens + 64, async_scheduling=async_scheduling)
    steps_ms = {}
    for n in contexts:
        prompt = prompt_of(n - decode_tokens, 7 + n)
        timed_generate(llm, prompt, "p", 1)
        _, steps = decode_steps(llm, prompt, "p", decode_tokens, repeats)  # as ActiveKV's: a median
        steps_ms[str(n)] = round(1000 * statistics.median(steps), 2)
    out = {"plain_decode_step_ms": steps_ms, "plain_cudagraph_mode": cudagraph_mode(llm)}
    shutdown(llm)
    print(json.dumps({"plain_decode_step_ms": steps_ms}), flush=True)
    return out
