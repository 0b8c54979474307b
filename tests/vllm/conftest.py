"""Real vLLM on the tiny model. Each LLM start costs ~20 s here, so instances are
shared: the baseline (no ActiveKV) for the whole session, each connector
configuration for its module (see make_llm on why one at a time).

Oracles are plain vLLM's answers with their margins checked: a greedy path
with a near-tie fails as one (NearTieError), never as a connector bug."""

from __future__ import annotations

import random

import pytest

from pipeline.vllm_driver import comparison
from pipeline.vllm_driver import llm as h
from pipeline.vllm_driver.tiny_model import STREAMING_LAYERS, tiny_llama

# The streaming tests' prompt: it fills the 8x context with the tokens generated.
STREAMING_PROMPT = h.random_tokens(random.Random(40), h.STREAMING_CONTEXT - h.MAX_TOKENS)


@pytest.fixture(scope="session")
def tiny_model(cache_dir):
    return tiny_llama(cache_dir)


@pytest.fixture(scope="session")
def baseline_llm(tiny_model):
    # In its own processes: it lives beside the in-process connector LLMs.
    llm = h.make_llm(tiny_model, connector=None, in_process=False)
    yield llm
    h.shutdown(llm)


@pytest.fixture(scope="session")
def oracle_margins(figures):
    """Smallest margin of every oracle run; the session's smallest is reported."""
    margins: list[float] = []
    yield margins
    if margins:
        figures.append(
            f"oracles: smallest top-1/top-2 logprob gap {min(margins):.3f} over "
            f"{len(margins)} runs (MIN_MARGIN {comparison.MIN_MARGIN})"
        )


@pytest.fixture(scope="session")
def plain(baseline_llm, oracle_margins):
    """plain(prompts): vLLM without ActiveKV from an empty prefix cache;
    plain(prompts, prefix_hit=True): the same prompts again after a first run,
    so each prefill is vLLM's own prefix-cache hit of every reusable token (the
    shapes of a full reload from the host store). Margins checked."""

    def run(prompts, *, prefix_hit: bool = False) -> list[comparison.Result]:
        prompts = [list(p) for p in prompts]
        h.flush_device_cache(baseline_llm)
        if prefix_hit:
            h.generate(baseline_llm, prompts)
        results = h.generate(baseline_llm, prompts)
        # From an empty cache a batch still shares its common prefixes, as the
        # connector's cold run does; a prefix hit covers every reusable token.
        want = [h.reusable_tokens(len(p)) for p in prompts]
        got = [r.num_cached_tokens for r in results]
        if prefix_hit and got != want:
            raise RuntimeError(f"plain vLLM cached {got} tokens, the oracle needs {want}")
        oracle_margins.append(comparison.require_clear_margins(results, "plain vLLM's answer"))
        return results

    return run


@pytest.fixture(scope="session")
def expected(plain):
    """Tokens vLLM generates without ActiveKV for each prompt, from an empty
    prefix cache, with clear margins (memoised)."""
    memo: dict[tuple[int, ...], tuple[int, ...]] = {}

    def tokens_for(prompts):
        todo = list(dict.fromkeys(tuple(p) for p in prompts if tuple(p) not in memo))
        if todo:
            for p, r in zip(todo, plain(todo), strict=False):
                memo[p] = r.tokens
        return [memo[tuple(p)] for p in prompts]

    return tokens_for


@pytest.fixture(scope="module", params=sorted(h.CONNECTORS))
def connector(request):
    """Each connector test module runs once per implementation."""
    return request.param


@pytest.fixture(scope="session")
def deep_model(cache_dir):
    """The tiny model with STREAMING_LAYERS layers: what the streaming tests stream."""
    return tiny_llama(cache_dir, STREAMING_LAYERS)


@pytest.fixture(scope="session")
def answer_with_8x_memory(deep_model, oracle_margins):
    """Plain vLLM (no connector) given 8x the streaming tests' budget M, on STREAMING_PROMPT."""
    llm = h.make_llm(
        deep_model,
        connector=None,
        kv_cache_bytes=8 * h.streaming_budget_bytes(STREAMING_LAYERS),
        max_model_len=h.STREAMING_CONTEXT,
        env=h.SAME_THREADS,
    )
    try:
        answer = h.generate(llm, [STREAMING_PROMPT])
    finally:
        h.shutdown(llm)
    oracle_margins.append(comparison.require_clear_margins(answer, "plain vLLM with 8x M"))
    return answer
