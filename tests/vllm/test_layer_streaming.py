"""Layer streaming in real vLLM: a context 8x what the device's KV budget holds.

The 16-layer tiny model in a budget M that holds STREAMING_BUDGET_BLOCKS blocks
of every layer: plain vLLM refuses a max_model_len of 8x what M holds; ActiveKV
with streaming serves it in the same M, with the tokens and logprobs of vLLM
given 8x M (both with the same CPU threads: h.SAME_THREADS)."""

from __future__ import annotations

import pytest

from activekv_reference.homes import rows_for
from pipeline.vllm_driver import comparison
from pipeline.vllm_driver import llm as h
from pipeline.vllm_driver.tiny_model import STREAMING_LAYERS
from tests.vllm.conftest import STREAMING_PROMPT
from tests.vllm.wrong_block import catches_a_wrong_block

pytestmark = pytest.mark.vllm

BUDGET = h.streaming_budget_bytes(STREAMING_LAYERS)
CONTEXT = h.STREAMING_CONTEXT
PROMPT = STREAMING_PROMPT


def test_plain_vllm_refuses_the_context_in_budget_m(deep_model, figures):
    # vLLM's own start-up check, raised by its in-process engine.
    with pytest.raises(ValueError, match=rf"max seq len \({CONTEXT}\)") as raised:
        h.make_llm(deep_model, connector=None, kv_cache_bytes=BUDGET, max_model_len=CONTEXT)
    refusal = f"ValueError: {raised.value}"
    holds = (h.STREAMING_BUDGET_BLOCKS - 1) * h.BLOCK_SIZE
    assert f"the estimated maximum model length is {holds}" in refusal
    assert CONTEXT == 8 * holds
    figures.append("plain vLLM in budget M: " + refusal.split("ValueError: ", 1)[1][:200])


@pytest.fixture(scope="module")
def streaming_llm(deep_model, connector):
    llm = h.make_llm(
        deep_model,
        {"streaming": h.STREAMING},
        connector=connector,
        kv_cache_bytes=BUDGET,
        max_model_len=CONTEXT,
        env=h.SAME_THREADS,
    )
    yield llm
    h.shutdown(llm)


def test_streaming_serves_8x_the_context_bitwise(streaming_llm, answer_with_8x_memory, connector, figures):
    with h.TelemetryDelta(streaming_llm) as moved:
        got = h.generate(streaming_llm, [PROMPT])
    diff = comparison.difference(got, answer_with_8x_memory)
    assert not diff, f"streaming in M differs from plain vLLM given 8x M: {diff}"
    # Every streamed layer's KV crossed into the ring: at least the prompt's
    # blocks once per streamed layer for the prefill.
    streamed = STREAMING_LAYERS - h.STREAMING["resident_layers"]
    assert moved["streamed_bytes_to_host"] >= (len(PROMPT) // h.BLOCK_SIZE) * streamed * h.layer_block_bytes()
    assert moved["streamed_bytes_to_device"] > 0
    # The start-up report, in the stats: 8x the blocks the budget holds without streaming.
    report = h.telemetry(streaming_llm)
    assert report["streaming_device_blocks_without"] == h.STREAMING_BUDGET_BLOCKS
    assert report["streaming_device_blocks"] == 8 * h.STREAMING_BUDGET_BLOCKS
    assert report["streaming_streamed_layers"] == streamed
    # Homes: the scheduler's home rows (homes.py) of every streamed layer.
    rows = rows_for(8 * h.STREAMING_BUDGET_BLOCKS)
    assert rows > 8 * h.STREAMING_BUDGET_BLOCKS
    assert report["streaming_host_bytes"] == rows * streamed * h.layer_block_bytes()
    figures.append(
        f"streaming ({connector}): {CONTEXT} tokens in a budget that holds "
        f"{CONTEXT // 8} for plain vLLM; tokens and logprobs bitwise those of plain vLLM (no connector) with "
        f"8x the memory; {moved['streamed_bytes_to_device'] / 2**20:.1f} MiB staged"
    )


@catches_a_wrong_block
def test_the_prefix_comes_back_from_the_host_store_while_streaming(streaming_llm, answer_with_8x_memory):
    # Under a salt of its own the prompt is computed afresh and stored, and
    # vLLM's own prefix hit on that KV is the oracle; then, once vLLM's own
    # cache is flushed, its blocks load from the host store into the ring and
    # are written back to their homes.
    salt = "reload-while-streaming"
    h.generate(streaming_llm, [PROMPT], salt=salt)
    own_hits = h.own_prefix_hits(streaming_llm, [PROMPT], salt=salt)
    h.flush_device_cache(streaming_llm)
    with h.TelemetryDelta(streaming_llm) as moved:
        again = h.generate(streaming_llm, [PROMPT], salt=salt)
    assert moved["hit_tokens"] == h.reusable_tokens(len(PROMPT))
    assert again[0].tokens == answer_with_8x_memory[0].tokens
    assert not comparison.check_reloads(again, own_hits)
