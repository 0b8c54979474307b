"""A host store smaller than the working set: LRU eviction, answers unchanged.

Each answer is checked bit for bit: a hit against vLLM's own prefix hit on the
KV the store took, a miss against the prompt's first (cold) run; the module
also runs against a planted bug that serves another block, which it must catch."""

from __future__ import annotations

import random

import pytest

from pipeline.vllm_driver import comparison
from pipeline.vllm_driver import llm as h
from tests.vllm.wrong_block import catches_a_wrong_block

pytestmark = pytest.mark.vllm

STORE_BLOCKS = 8
BLOCKS_PER_PROMPT = 4


@pytest.fixture(scope="module")
def small_store_llm(tiny_model, connector):
    llm = h.make_llm(tiny_model, {"capacity_bytes": STORE_BLOCKS * h.exact_block_bytes()}, connector=connector)
    yield llm
    h.shutdown(llm)


@catches_a_wrong_block
def test_store_smaller_than_working_set_evicts_least_recently_used(small_store_llm, expected):
    llm = small_store_llm
    rng = random.Random(4)
    # Each prompt has BLOCKS_PER_PROMPT reusable blocks; two fill the store.
    p1, p2, p3 = (h.random_tokens(rng, BLOCKS_PER_PROMPT * h.BLOCK_SIZE + 1) for _ in range(3))
    answers, cold, own_hits = {}, {}, {}

    def run(name, prompt):
        h.flush_device_cache(llm)
        with h.TelemetryDelta(llm) as delta:
            result = h.generate(llm, [prompt])[0]
        answers.setdefault(name, []).append(result)
        if name not in cold:  # the first run computed the KV the store takes
            cold[name] = result
            own_hits[name] = h.own_prefix_hits(llm, [prompt])
        return delta

    run("p1", p1)
    stored = run("p2", p2)
    assert stored["evicted_blocks"] == 0 and stored["stored_blocks"] == BLOCKS_PER_PROMPT
    # p1 is used again: it becomes more recent than p2.
    assert run("p1", p1)["hit_blocks"] == BLOCKS_PER_PROMPT
    # Storing p3 must evict the least recently used blocks: p2's, not p1's.
    third = run("p3", p3)
    assert third["evicted_blocks"] == BLOCKS_PER_PROMPT
    assert third["stored_blocks"] == BLOCKS_PER_PROMPT
    assert run("p1", p1)["hit_blocks"] == BLOCKS_PER_PROMPT
    assert run("p2", p2)["hit_blocks"] == 0
    # p2 came back into the store and evicted the least recent blocks: p3's.
    assert run("p3", p3)["hit_blocks"] == 0

    for name, prompt in (("p1", p1), ("p2", p2), ("p3", p3)):
        assert {r.tokens for r in answers[name]} == {expected([prompt])[0]}, f"{name} changed under eviction"
        for r in answers[name][1:]:
            if r.num_cached_tokens:  # served from the host store
                assert not comparison.check_reloads([r], own_hits[name]), name
            else:
                assert not comparison.difference([r], [cold[name]]), f"{name}: a miss differs from its first run"
