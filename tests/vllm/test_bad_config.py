"""Bad ActiveKV configuration stops vLLM at start-up with a message naming the key."""

from __future__ import annotations

import pytest

from pipeline.vllm_driver import llm as h

pytestmark = pytest.mark.vllm

# One real-vLLM start per kind of refusal and engine: that the message
# reaches the operator through vLLM's start-up. Every message, word for word
# and equal in both engines, is checked without vLLM (tests/reference/
# test_config.py, tests/unit/test_native_module.py, engine/tests/test_config.cpp).
CASES = {
    # A value that does not parse.
    "unknown-key": ({"capacity": 1 << 20}, ["unknown key 'capacity'", "capacity_bytes"]),
    # A capacity against the block size of the model vLLM loaded.
    "store-too-small": ({"capacity_bytes": 1024}, ["'capacity_bytes'", "holds no block"]),
    # A streaming geometry against the model's layers (the tiny model has 4).
    "streaming-saves-nothing": (
        {"streaming": {"resident_layers": 2, "ring_size": 2}},
        ["resident_layers + ring_size = 2 + 2", "below the model's 4"],
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bad_config_fails_at_startup_naming_the_key(case, tiny_model, connector, capfd):
    extra, fragments = CASES[case]
    with pytest.raises(Exception) as raised:
        h.make_llm(tiny_model, extra, connector=connector)
    # The message is the exception's (an in-process engine) or on stderr (an engine process).
    err = capfd.readouterr().err + str(raised.value)
    for fragment in fragments:
        assert fragment in err, f"start-up error does not say {fragment!r}"


def test_a_budget_too_small_for_one_request_even_streamed_stops_vllm(tiny_model, connector, capfd):
    """vLLM's own start-up check counts the regions streaming allocates: the
    budget below holds 7 usable blocks of 4 layers, 15 streamed (2 regions)."""
    budget = 8 * 4 * h.layer_block_bytes()
    with pytest.raises(Exception) as raised:
        h.make_llm(tiny_model, {"streaming": h.STREAMING}, connector=connector, kv_cache_bytes=budget)
    err = capfd.readouterr().err + str(raised.value)
    assert f"max seq len ({h.MAX_MODEL_LEN})" in err
    assert f"the estimated maximum model length is {15 * h.BLOCK_SIZE}" in err
