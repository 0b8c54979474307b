"""The oracles stand on clear margins: a near-tie is reported as one, and the
generated model gives every greedy step a clear margin while its logprobs
still show the KV cache (what the same-shape oracles compare bit for bit)."""

from __future__ import annotations

import random

import pytest

from pipeline.vllm_driver import comparison
from pipeline.vllm_driver import llm as h


def result(*steps: tuple[tuple[int, float], ...]) -> comparison.Result:
    return comparison.Result(tuple(s[0][0] for s in steps), 0, tuple(steps))


CLEAR = ((52, -0.0), (249, -16.3), (33, -17.0))
NEAR = ((117, -0.69), (114, -0.75), (33, -9.0))


def test_near_tie_fails_as_a_near_tie_naming_where():
    with pytest.raises(comparison.NearTieError) as raised:
        comparison.require_clear_margins([result(CLEAR), result(CLEAR, NEAR)], "the oracle")
    message = str(raised.value)
    assert "near tie in the oracle" in message
    assert "0.0600 at prompt 1, generated token 1 (117 over 114)" in message
    assert "not evidence of a connector bug" in message


def test_clear_margins_pass_and_give_the_smallest():
    assert comparison.require_clear_margins([result(CLEAR, CLEAR)], "the oracle") == pytest.approx(16.3)


def test_difference_is_bit_for_bit_on_the_top_logprobs():
    nudged = ((52, -0.0), (249, -16.3125), (33, -17.0))
    assert comparison.difference([result(CLEAR)], [result(CLEAR)]) == ""
    assert "generated token 0" in comparison.difference([result(CLEAR)], [result(nudged)])
    assert comparison.largest_logprob_gap([result(CLEAR)], [result(nudged)]) == pytest.approx(0.0125)


@pytest.mark.vllm
def test_generated_model_has_clear_margins_on_every_greedy_step(baseline_llm, figures):
    # Prompt lengths as the suite uses them: under a block to max_model_len's worth.
    # Plain vLLM's answers read directly (not through the `plain` fixture,
    # which raises on a near tie itself): this test's assertion is the check.
    rng = random.Random(300)
    lengths = [1, 17, 33, 65, 100, 197, 300, 700, 1100, 2048 + 9]
    h.flush_device_cache(baseline_llm)
    results = h.generate(baseline_llm, [h.random_tokens(rng, n) for n in lengths])
    margin, where = comparison.smallest_margin(results)
    figures.append(
        f"model margins: smallest top-1/top-2 gap {margin:.3f} ({where}) over "
        f"{len(lengths)} prompts x {h.MAX_TOKENS} tokens; MIN_MARGIN {comparison.MIN_MARGIN}"
    )
    assert margin >= comparison.MIN_MARGIN, f"near tie at {where}: {margin:.4f}"


# How far one changed early token must move the logprobs: two bf16 steps of the
# coarsest logits (below 64 they round in steps of at most 0.25), so a
# rounding difference of a ULP or two does not pass for the KV cache's effect.
# Measured: 1.125 (2026-12-01, the test's own prompt).
KV_EFFECT_MIN = 0.5


@pytest.mark.vllm
def test_kv_cache_shows_in_the_logprobs(plain, figures):
    # One early token changed: its KV differs, and so do the logprobs that the
    # bit-for-bit oracles compare (else they could not catch a wrong block).
    prompt = h.random_tokens(random.Random(301), 6 * h.BLOCK_SIZE + 1)
    other = list(prompt)
    other[3] = h.FIRST_TOKEN + (other[3] - h.FIRST_TOKEN + 1) % (h.VOCAB - h.FIRST_TOKEN)
    gap = comparison.largest_logprob_gap(plain([prompt]), plain([other]))
    figures.append(f"one early token changed moves the top logprobs by up to {gap:.3f}")
    assert gap >= KV_EFFECT_MIN
