"""Bad ActiveKV configuration stops vLLM at start-up with a message naming the key."""

from __future__ import annotations

import pytest

from pipeline.harness import vllm_harness as h

pytestmark = pytest.mark.vllm

CASES = {
    "unknown-key": ({"capacity": 1 << 20}, ["unknown key 'capacity'", "capacity_bytes"]),
    "wrong-type": ({"capacity_bytes": "1G"}, ["'capacity_bytes'", "expected an integer"]),
    "negative-capacity": ({"capacity_bytes": -1}, ["'capacity_bytes'", "positive"]),
    "unknown-mode": ({"mode": "lossy"}, ["'mode'", "'exact', 'compressed'"]),
    "store-too-small": ({"capacity_bytes": 1024}, ["'capacity_bytes'", "holds no block"]),
    # Layer streaming (the tiny model has 4 KV cache layers).
    "streaming-not-a-table": ({"streaming": 2}, ["['streaming']", "expected a table"]),
    "streaming-unknown-key": ({"streaming": {"resident": 1}}, ["unknown key 'resident'",
                                                              "resident_layers, ring_size"]),
    "streaming-ring-of-one": ({"streaming": {"ring_size": 1}}, ["['streaming']['ring_size']",
                                                               "an integer >= 2"]),
    "streaming-every-layer-resident": ({"streaming": {"resident_layers": 4}},
                                       ["['resident_layers']", "accepts 0..3"]),
    "streaming-saves-nothing": ({"streaming": {"resident_layers": 2, "ring_size": 2}},
                                ["resident_layers + ring_size = 2 + 2", "below the model's 4"]),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bad_config_fails_at_startup_naming_the_key(case, tiny_model, connector, capfd):
    extra, fragments = CASES[case]
    with pytest.raises(Exception) as raised:
        h.make_llm(tiny_model, extra, connector=connector)
    # The connector runs in vLLM's engine process: its message reaches us on stderr.
    err = capfd.readouterr().err + str(raised.value)
    for fragment in fragments:
        assert fragment in err, f"start-up error does not say {fragment!r}"


def test_a_budget_too_small_for_one_request_even_streamed_stops_vllm(tiny_model, connector, capfd):
    """vLLM's own start-up check counts the regions streaming allocates: the
    budget below holds 7 usable blocks of 4 layers, 15 streamed (2 regions)."""
    budget = 8 * 4 * h.layer_block_bytes()
    with pytest.raises(Exception):
        h.make_llm(tiny_model, {"streaming": h.STREAMING}, connector=connector, kv_cache_bytes=budget)
    err = capfd.readouterr().err
    assert f"max seq len ({h.MAX_MODEL_LEN})" in err
    assert f"the estimated maximum model length is {15 * h.BLOCK_SIZE}" in err
