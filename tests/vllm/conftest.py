"""Real vLLM on the tiny model. Each LLM start costs ~20 s here, so instances are
shared: the baseline (no ActiveKV) for the whole session, each connector
configuration for its module (see make_llm on why one at a time)."""

from __future__ import annotations

import pytest

from pipeline import vllm_harness as h
from pipeline.tiny_model import tiny_llama



@pytest.fixture(scope="session")
def tiny_model(cache_dir):
    return tiny_llama(cache_dir)


@pytest.fixture(scope="session")
def baseline_llm(tiny_model):
    llm = h.make_llm(tiny_model, connector=None)
    yield llm
    h.shutdown(llm)


@pytest.fixture(scope="session")
def expected(baseline_llm):
    """Tokens vLLM generates without ActiveKV for each prompt (memoised)."""
    memo: dict[tuple[int, ...], tuple[int, ...]] = {}

    def tokens_for(prompts):
        todo = [tuple(p) for p in prompts if tuple(p) not in memo]
        for p, r in zip(todo, h.generate(baseline_llm, todo)):
            memo[p] = r.tokens
        return [memo[tuple(p)] for p in prompts]

    return tokens_for


@pytest.fixture(scope="module", params=sorted(h.CONNECTORS))
def connector(request):
    """Each connector test module runs once per implementation."""
    return request.param
