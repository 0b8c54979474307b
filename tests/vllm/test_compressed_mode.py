"""Compressed mode in real vLLM: about half the host bytes, deterministic."""

from __future__ import annotations

import random

import pytest

from pipeline import vllm_harness as h

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def compressed_llm(tiny_model, connector):
    llm = h.make_llm(tiny_model, {"mode": "compressed"}, connector=connector)
    yield llm
    h.shutdown(llm)


def bytes_per_block(delta: dict[str, float]) -> float:
    assert delta["saved_blocks"] > 0
    return delta["bytes_to_host"] / delta["saved_blocks"]


def test_compressed_blocks_take_about_half_the_bytes(compressed_llm, figures):
    rng = random.Random(5)
    prompt = h.random_tokens(rng, 8 * h.BLOCK_SIZE + 3)
    with h.TelemetryDelta(compressed_llm) as compressed:
        h.generate(compressed_llm, [prompt])
    # Exact mode's telemetry equals this figure (test_exact_mode checks it).
    exact = h.exact_block_bytes()
    ratio = bytes_per_block(compressed) / exact
    figures.append(
        f"compressed: {bytes_per_block(compressed):.0f} host bytes per block vs exact "
        f"{exact} (ratio {ratio:.4f})"
    )
    assert 0.5 <= ratio <= 0.6


def test_compressed_mode_is_deterministic_and_reports_agreement(compressed_llm, expected, figures):
    rng = random.Random(6)
    prompts = [h.random_tokens(rng, n) for n in (3 * h.BLOCK_SIZE + 2, 9 * h.BLOCK_SIZE + 1, 700)]
    h.generate(compressed_llm, prompts)  # store them
    runs = []
    for _ in range(2):
        h.flush_device_cache(compressed_llm)
        with h.TelemetryDelta(compressed_llm) as delta:
            runs.append([r.tokens for r in h.generate(compressed_llm, prompts)])
        assert delta["hit_tokens"] == sum(h.reusable_tokens(len(p)) for p in prompts)
    assert runs[0] == runs[1], "compressed mode gave different tokens on two runs"

    want = expected(prompts)
    same = sum(a == b for got, ref in zip(runs[0], want) for a, b in zip(got, ref))
    total = sum(len(ref) for ref in want)
    figures.append(
        f"compressed vs exact (prefix served from the host store): {same}/{total} generated "
        f"tokens agree ({same / total:.1%})"
    )
