"""Admission policy in real vLLM: store threshold, per-request byte cap, decode blocks.

Each block served from the host store is checked bit for bit against vLLM's
own prefix hit on the KV the store took (the logprobs: on the shaped tiny
model the tokens hardly depend on the KV), and the module also runs against a
planted bug that serves another block, which each test must catch."""

from __future__ import annotations

import random

import pytest

from pipeline.vllm_driver import comparison
from pipeline.vllm_driver import llm as h
from tests.vllm.wrong_block import catches_a_wrong_block

pytestmark = pytest.mark.vllm

THRESHOLD = 2
CAP_BLOCKS = 6


@pytest.fixture(scope="module")
def policy_llm(tiny_model, connector):
    extra = {
        "store_threshold": THRESHOLD,
        "max_bytes_per_request": CAP_BLOCKS * h.exact_block_bytes(),
        "store_blocks": "prompt_and_decode",
    }
    llm = h.make_llm(tiny_model, extra, connector=connector)
    yield llm
    h.shutdown(llm)


def run(llm, prompt):
    h.flush_device_cache(llm)
    with h.TelemetryDelta(llm) as delta:
        result = h.generate(llm, [prompt])[0]
    return result, delta


@catches_a_wrong_block
def test_block_is_stored_on_its_threshold_sighting(policy_llm, expected):
    prompt = h.random_tokens(random.Random(7), 4 * h.BLOCK_SIZE + 1)
    first, seen_once = run(policy_llm, prompt)
    assert seen_once["stored_blocks"] == 0 and seen_once["rejected_threshold"] == 4
    second, seen_twice = run(policy_llm, prompt)
    assert seen_twice["hit_blocks"] == 0 and seen_twice["stored_blocks"] == 4
    own_hits = h.own_prefix_hits(policy_llm, [prompt])  # on the KV the store took
    third, served = run(policy_llm, prompt)
    assert served["hit_blocks"] == 4
    assert first.tokens == second.tokens == expected([prompt])[0]
    assert not comparison.check_reloads([third], own_hits)


@catches_a_wrong_block
def test_request_writes_at_most_its_byte_cap(policy_llm, expected):
    prompt = h.random_tokens(random.Random(8), 10 * h.BLOCK_SIZE + 1)
    run(policy_llm, prompt)  # first sighting: nothing stored
    _, capped = run(policy_llm, prompt)
    assert capped["stored_blocks"] == CAP_BLOCKS
    assert capped["rejected_request_cap"] == 10 - CAP_BLOCKS
    # The leading blocks are what a hit needs: a request on them and a tail of
    # its own reloads exactly them (the oracle: vLLM's own hit on the same KV).
    leading = prompt[: CAP_BLOCKS * h.BLOCK_SIZE] + h.random_tokens(random.Random(18), 20)
    own_hits = h.own_prefix_hits(policy_llm, [leading])
    assert [r[0].num_cached_tokens for r in own_hits] == [CAP_BLOCKS * h.BLOCK_SIZE] * 2
    result, served = run(policy_llm, prompt)
    assert served["hit_blocks"] == CAP_BLOCKS
    assert result.tokens == expected([prompt])[0]
    again, served = run(policy_llm, leading)
    assert served["hit_blocks"] == CAP_BLOCKS
    assert not comparison.check_reloads([again], own_hits)


@catches_a_wrong_block
def test_decode_blocks_are_stored_and_serve_the_next_turn(policy_llm, expected):
    # 2 prompt blocks + 20 tokens; 16 generated tokens fill the third block.
    prompt = h.random_tokens(random.Random(9), 2 * h.BLOCK_SIZE + 20)
    assert len(prompt) + h.MAX_TOKENS >= 3 * h.BLOCK_SIZE
    first, _ = run(policy_llm, prompt)
    _, stored = run(policy_llm, prompt)  # second sighting of every block, decode one too
    assert stored["stored_blocks"] == 3
    next_turn = prompt + list(first.tokens) + h.random_tokens(random.Random(10), 5)
    own_hits = h.own_prefix_hits(policy_llm, [next_turn])  # the decode block from vLLM's cache
    assert [r[0].num_cached_tokens for r in own_hits] == [3 * h.BLOCK_SIZE] * 2
    result, served = run(policy_llm, next_turn)
    assert served["hit_blocks"] == 3  # the third block only ever existed as decode output
    assert result.tokens == expected([next_turn])[0]
    assert not comparison.check_reloads([result], own_hits)
