"""Exact mode in real vLLM: blocks come back from host RAM, answers unchanged.

Every reload is checked bit for bit against vLLM's own prefix hit on the KV
the store took, and runs against a planted bug that serves another block,
which each test must catch."""

from __future__ import annotations

import random

import pytest

from pipeline.vllm_driver import comparison
from pipeline.vllm_driver import llm as h
from tests.vllm.wrong_block import catches_a_wrong_block

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def exact_llm(tiny_model, connector):
    llm = h.make_llm(tiny_model, {"mode": "exact"}, connector=connector)
    yield llm
    h.shutdown(llm)


@catches_a_wrong_block
def test_prefix_pushed_out_of_vllm_cache_is_served_from_host_store(exact_llm, plain, figures):
    served_from_host_store(exact_llm, plain, figures, seed=1, label="exact reload")


def served_from_host_store(llm, plain, figures, *, seed: int, label: str, loads_async: bool = False) -> int:
    """A prompt pushed out of vLLM's prefix cache comes back from the host
    store, bit for bit vLLM's own prefix hit; returns the tokens reused.
    `loads_async`: the LLM loads every hit asynchronously (else none)."""
    rng = random.Random(seed)
    prompt = h.random_tokens(rng, 10 * h.BLOCK_SIZE + 5)
    # A request of max_model_len tokens needs every device block: it evicts the prompt.
    filler = h.random_tokens(rng, h.MAX_MODEL_LEN - h.MAX_TOKENS)
    reusable = h.reusable_tokens(len(prompt))

    first = h.generate(llm, [prompt])[0]
    # The oracle: vLLM's own prefix-cache hit on the KV the cold run computed,
    # in this engine: the shapes of a reload (reusable cached + the rest), run
    # twice to see that vLLM agrees with itself on them.
    own_hits = h.own_prefix_hits(llm, [prompt])
    h.generate(llm, [filler])
    with h.TelemetryDelta(llm) as delta:
        again = h.generate(llm, [prompt])[0]

    assert first.num_cached_tokens == 0
    assert all(run[0].num_cached_tokens == reusable for run in own_hits)
    assert delta["hit_tokens"] == reusable  # every reusable token came from the host store
    assert again.num_cached_tokens == reusable
    # Exact mode stores the KV bytes and nothing else.
    assert delta["bytes_to_device"] == delta["loaded_blocks"] * h.exact_block_bytes()
    assert delta["loaded_blocks"] > 0
    assert delta["async_loaded_blocks"] == (delta["loaded_blocks"] if loads_async else 0)
    # Same engine, same shapes, same KV bytes: the same logprobs, bit for bit.
    figures.extend(f"{label}: {note}" for note in comparison.check_reloads([again], own_hits))
    # Plain vLLM (no connector) with its own prefix hit of the same cached-token count.
    (plain_hit,) = plain([prompt], prefix_hit=True)
    assert again.tokens == first.tokens == plain_hit.tokens
    bitwise = comparison.difference([again], [plain_hit])
    figures.append(
        f"{label} vs plain vLLM's own prefix hit (another LLM instance): tokens equal, "
        + (
            "logprobs bit for bit equal"
            if not bitwise
            else f"top logprobs within {comparison.largest_logprob_gap([again], [plain_hit]):.2e} "
            f"(first difference at {bitwise.split(':')[0]})"
        )
    )
    return reusable


@catches_a_wrong_block
def test_cache_salt_isolates_tenants(exact_llm, expected):
    rng = random.Random(2)
    prompt = h.random_tokens(rng, 6 * h.BLOCK_SIZE + 1)
    h.flush_device_cache(exact_llm)
    first = h.generate(exact_llm, [prompt], salt="tenant-a")[0]
    own_hits = h.own_prefix_hits(exact_llm, [prompt], salt="tenant-a")

    for salt in ("tenant-b", None):
        h.flush_device_cache(exact_llm)
        with h.TelemetryDelta(exact_llm) as delta:
            other = h.generate(exact_llm, [prompt], salt=salt)[0]
        assert delta["hit_tokens"] == 0, f"salt {salt!r} was served tenant-a's blocks"
        assert other.num_cached_tokens == 0
        assert other.tokens == expected([prompt])[0]
        assert not comparison.difference([other], [first]), f"salt {salt!r}: a cold run differs from tenant-a's"

    h.flush_device_cache(exact_llm)
    with h.TelemetryDelta(exact_llm) as delta:
        same = h.generate(exact_llm, [prompt], salt="tenant-a")[0]
    assert delta["hit_tokens"] == h.reusable_tokens(len(prompt))
    assert same.tokens == expected([prompt])[0]
    assert not comparison.check_reloads([same], own_hits)


# The mixed batch's own LLM: a device cache that holds the whole batch, so
# vLLM's own prefix hits give every request the shapes of its reload.
BATCH_DEVICE_BLOCKS = 4 * h.NUM_DEVICE_BLOCKS


@pytest.fixture(scope="module")
def batch_llm(tiny_model, connector):
    llm = h.make_llm(
        tiny_model, {"mode": "exact"}, connector=connector, kv_cache_bytes=BATCH_DEVICE_BLOCKS * h.exact_block_bytes()
    )
    yield llm
    h.shutdown(llm)


@catches_a_wrong_block
def test_mixed_concurrent_batch(batch_llm, expected, figures):
    rng = random.Random(3)
    shared_a = h.random_tokens(rng, 4 * h.BLOCK_SIZE)
    shared_b = h.random_tokens(rng, 2 * h.BLOCK_SIZE + 7)
    batch = [
        h.random_tokens(rng, 2048 + 9),  # the long one
        shared_a + h.random_tokens(rng, 40),
        shared_a + h.random_tokens(rng, 3),
        shared_a + h.random_tokens(rng, 150),
        shared_b + h.random_tokens(rng, 64),
        shared_b + h.random_tokens(rng, 1),
        h.random_tokens(rng, 17),  # shorter than a block: nothing to store
        h.random_tokens(rng, 300),
        shared_a + shared_b,
    ]
    assert len(batch) >= 8 and max(map(len, batch)) >= 2048
    want = expected(batch)

    with h.TelemetryDelta(batch_llm) as cold:
        first = h.generate(batch_llm, batch)
    own_hits = h.own_prefix_hits(batch_llm, batch)
    h.flush_device_cache(batch_llm)
    with h.TelemetryDelta(batch_llm) as warm:
        second = h.generate(batch_llm, batch)

    assert [r.tokens for r in first] == want
    assert [r.tokens for r in second] == want
    # Second pass: vLLM's cache was dropped, so every reusable token of every
    # prompt is either loaded from the host store or shared within the batch.
    reusable = [h.reusable_tokens(len(p)) for p in batch]
    assert all(r.num_cached_tokens == n for r, n in zip(second, reusable, strict=False))
    assert warm["hit_tokens"] >= h.reusable_tokens(len(batch[0]))
    assert cold["stored_blocks"] > 0
    assert not comparison.check_reloads(second, own_hits)
    figures.append(
        f"mixed batch: cold pass stored {cold['stored_blocks']:.0f} blocks; warm pass "
        f"{warm['hit_tokens']:.0f} tokens from the host store"
    )


# Last in the module: in this process vLLM keeps one connector per process,
# so an LLM made while another is still in use takes that one's connector
# from it (each LLM of this module is made after the one before it is done).
@pytest.fixture(scope="module")
def async_llm(tiny_model, connector):
    """Every hit of a block or more loads asynchronously (vLLM parks the
    request while its blocks cross); in this process, to see it happen."""
    llm = h.make_llm(
        tiny_model, {"mode": "exact", "async_load_min_tokens": h.BLOCK_SIZE}, connector=connector, in_process=True
    )
    yield llm
    h.shutdown(llm)


@catches_a_wrong_block
def test_a_hit_loaded_asynchronously_is_served_bitwise(async_llm, plain, figures):
    connector = async_llm.llm_engine.engine_core.engine_core.scheduler.connector
    lookup = connector.get_num_new_matched_tokens
    answers = []  # every lookup's (tokens, loads asynchronously)

    def recorded(request, num_computed_tokens):
        answers.append(tuple(lookup(request, num_computed_tokens)))
        return answers[-1]

    connector.get_num_new_matched_tokens = recorded
    try:
        reusable = served_from_host_store(
            async_llm, plain, figures, seed=3, label="asynchronous reload", loads_async=True
        )
    finally:
        del connector.get_num_new_matched_tokens
    assert (reusable, True) in answers, f"no lookup loaded the hit asynchronously: {answers}"
