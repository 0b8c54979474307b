"""Speculative decoding (vLLM's n-gram drafts) in real vLLM: a decode step
writes the drafts' KV and keeps only the accepted tokens' KV, so a decode
block may be saved only once every token in it is accepted. The store is
checked bit for bit against vLLM's own prefix hit on the KV it kept, and
against a planted bug that serves another block; layer streaming refuses
speculative decoding at start-up, naming both."""

from __future__ import annotations

import random
import sys

import pytest

from pipeline.vllm_driver import comparison
from pipeline.vllm_driver import llm as h
from tests.vllm.wrong_block import catches_a_wrong_block

pytestmark = pytest.mark.vllm

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
# On the tiny model's random weights this prompt's greedy answer falls into a
# loop, where the n-gram drafts are accepted.
PROMPT = h.random_tokens(random.Random(0), 5 * h.BLOCK_SIZE + 5)
# The answer's KV fills six decode blocks (its last token has none yet).
ANSWER_TOKENS = 6 * h.BLOCK_SIZE - 5 + 1


@pytest.fixture(scope="module")
def speculative_llm(tiny_model, connector):
    extra = {"mode": "exact", "store_blocks": "prompt_and_decode"}
    # In processes of its own: vLLM's n-gram proposer imports numba, whose
    # objects break vLLM's kernel scan at the next in-process start (and
    # whose warnings the tests' filter would raise). Nothing here may import it.
    llm = h.make_llm(tiny_model, extra, connector=connector, llm_args={"speculative_config": NGRAM}, in_process=False)
    yield llm
    h.shutdown(llm)
    assert "numba" not in sys.modules, "numba was imported into the tests' process: later in-process vLLMs fail"


def accepted_drafts(llm) -> int:
    return sum(m.value for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_accepted_tokens")


@catches_a_wrong_block
def test_decode_blocks_written_under_accepted_drafts_serve_the_next_turn(speculative_llm, expected):
    before = accepted_drafts(speculative_llm)
    h.flush_device_cache(speculative_llm)
    with h.TelemetryDelta(speculative_llm) as stored:
        first = h.generate(speculative_llm, [PROMPT], max_tokens=ANSWER_TOKENS)[0]
    drafted = accepted_drafts(speculative_llm) - before
    assert drafted > ANSWER_TOKENS // 4, f"only {drafted} draft tokens accepted: the test would not test drafts"
    # A block is saved once every token in it is verified: in the step after
    # drafts filled it, so a block the last step filled is not saved.
    full_blocks = (len(PROMPT) + len(first.tokens) - 1) // h.BLOCK_SIZE
    kept = int(stored["stored_blocks"])
    assert full_blocks - 1 <= kept <= full_blocks

    next_turn = (PROMPT + list(first.tokens))[: kept * h.BLOCK_SIZE] + h.random_tokens(random.Random(1), 5)
    own_hits = h.own_prefix_hits(speculative_llm, [next_turn])  # vLLM's cache: the KV the drafts' steps kept
    assert [r[0].num_cached_tokens for r in own_hits] == [kept * h.BLOCK_SIZE] * 2
    h.flush_device_cache(speculative_llm)
    with h.TelemetryDelta(speculative_llm) as served:
        again = h.generate(speculative_llm, [next_turn])[0]
    assert served["hit_blocks"] == kept  # decode blocks that only ever existed as drafted output
    assert again.tokens == expected([next_turn])[0]
    assert not comparison.check_reloads([again], own_hits)


def test_layer_streaming_refuses_speculative_decoding_naming_both(tiny_model, capfd):
    # The engine core refuses to start; its error is in its own output.
    with pytest.raises(RuntimeError, match="Engine core initialization failed"):
        h.make_llm(
            tiny_model,
            {"streaming": h.STREAMING},
            connector="native",
            llm_args={"speculative_config": NGRAM},
            in_process=False,
        )
    out, err = capfd.readouterr()
    assert "speculative decoding (speculative_config is set); turn one of them off" in out + err
