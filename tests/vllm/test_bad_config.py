"""Bad ActiveKV configuration stops vLLM at start-up with a message naming the key."""

from __future__ import annotations

import pytest

from pipeline import vllm_harness as h

pytestmark = pytest.mark.vllm

CASES = {
    "unknown-key": ({"capacity": 1 << 20}, ["unknown key 'capacity'", "capacity_bytes"]),
    "wrong-type": ({"capacity_bytes": "1G"}, ["'capacity_bytes'", "expected an integer"]),
    "negative-capacity": ({"capacity_bytes": -1}, ["'capacity_bytes'", "positive"]),
    "unknown-mode": ({"mode": "lossy"}, ["'mode'", "'exact', 'compressed'"]),
    "store-too-small": ({"capacity_bytes": 1024}, ["'capacity_bytes'", "holds no block"]),
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
