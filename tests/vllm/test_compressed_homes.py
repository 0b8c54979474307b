"""Layer streaming with compressed homes in real vLLM: the 8x context of
test_layer_streaming.py in the same budget M, with the streamed layers' homes
held as int8 + scales (streaming.homes = "compressed").

What it may cost: each staged block is the codec's decode of its encode, so
every streamed layer's history (all but the step's own new tokens) carries the
codec's error, at most amax/254 + bf16 rounding per element of a head_size row
(reference/activekv_reference/codec.py): the error of compressed mode's prefix
hits (test_compressed_mode.py), here on the whole context. Where a row is one
token's head vector (the CUDA layouts), re-encoding the last, partly filled
block at each decode step adds nothing: decode then encode gives the same bytes
back (test_codec.py). vLLM's CPU cache keeps K transposed, so there a row spans
a block's 16 tokens and is quantized again as the block fills; measured 0.375
on this model, within the same bound as compressed mode's: half the oracles'
MIN_MARGIN, so no greedy token can flip."""

from __future__ import annotations

import pytest
import torch

from activekv_reference.codec import layer_bytes
from activekv_reference.homes import rows_for
from pipeline.vllm_driver import comparison
from pipeline.vllm_driver import llm as h
from pipeline.vllm_driver.tiny_model import STREAMING_LAYERS
from tests.vllm.conftest import STREAMING_PROMPT as PROMPT

pytestmark = pytest.mark.vllm

MAX_LOGPROB_GAP = 0.5
assert MAX_LOGPROB_GAP < comparison.MIN_MARGIN
HOMES = {**h.STREAMING, "homes": "compressed"}


def compressed_layer_bytes() -> int:
    head = h.CONFIG["hidden_size"] // h.CONFIG["num_attention_heads"]
    return layer_bytes("compressed", h.layer_block_bytes() // 2, torch.bfloat16, head)


@pytest.fixture(scope="module")
def compressed_homes_llm(deep_model, connector):
    llm = h.make_llm(
        deep_model,
        {"streaming": HOMES},
        connector=connector,
        kv_cache_bytes=h.streaming_budget_bytes(STREAMING_LAYERS),
        max_model_len=h.STREAMING_CONTEXT,
        env=h.SAME_THREADS,
    )
    yield llm
    h.shutdown(llm)


def test_compressed_homes_serve_8x_the_context_within_the_bound(
    compressed_homes_llm, answer_with_8x_memory, connector, figures
):
    # Each run under its own salt: the whole prompt is computed and streamed
    # again, so the two runs take the same path.
    runs = []
    for salt in ("compressed-homes-1", "compressed-homes-2"):
        with h.TelemetryDelta(compressed_homes_llm) as moved:
            runs.append(h.generate(compressed_homes_llm, [PROMPT], salt=salt))
        streamed = STREAMING_LAYERS - HOMES["resident_layers"]
        # Every streamed block crossed as its compressed bytes.
        assert moved["streamed_bytes_to_host"] % compressed_layer_bytes() == 0
        assert moved["streamed_bytes_to_host"] >= (len(PROMPT) // h.BLOCK_SIZE) * streamed * compressed_layer_bytes()
    ours_differs = comparison.difference(*runs)
    assert ours_differs == "", f"compressed homes gave different answers on two runs: {ours_differs}"
    want = answer_with_8x_memory
    gap = comparison.largest_logprob_gap(runs[0], want)
    same = sum(
        a == b for got, ref in zip(runs[0], want, strict=False) for a, b in zip(got.tokens, ref.tokens, strict=False)
    )
    total = sum(len(ref.tokens) for ref in want)
    figures.append(
        f"compressed homes ({connector}): {h.STREAMING_CONTEXT} tokens in budget M; {same}/{total} "
        f"generated tokens those of plain vLLM with 8x M; top logprobs within {gap:.3f} (bound "
        f"{MAX_LOGPROB_GAP}); homes {compressed_layer_bytes()} bytes a block and layer against "
        f"{h.layer_block_bytes()} exact"
    )
    assert gap <= MAX_LOGPROB_GAP, f"compressed homes moved a top logprob by {gap:.3f}"
    assert same == total, f"compressed homes changed {total - same} of {total} greedy tokens"
    assert gap > 0, "compressed homes gave exact's logprobs: were the homes compressed at all?"


def test_the_start_up_report_counts_compressed_homes(compressed_homes_llm):
    report = h.telemetry(compressed_homes_llm)
    streamed = STREAMING_LAYERS - HOMES["resident_layers"]
    rows = rows_for(8 * h.STREAMING_BUDGET_BLOCKS)
    assert report["streaming_host_bytes"] == rows * streamed * compressed_layer_bytes()
    assert compressed_layer_bytes() < 0.6 * h.layer_block_bytes()
