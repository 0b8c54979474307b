from __future__ import annotations

from activekv_reference.config import ActiveKVConfig
from activekv_reference.policy import AdmissionPolicy


def test_store_threshold_admits_on_nth_sighting():
    policy = AdmissionPolicy(ActiveKVConfig(store_threshold=3), slot_bytes=100)
    for sightings in range(1, 4):
        policy.sight([b"a"])
        assert policy.admits(b"a") == (sightings >= 3)


def test_request_byte_cap_counts_whole_blocks():
    policy = AdmissionPolicy(ActiveKVConfig(max_bytes_per_request=250), slot_bytes=100)
    assert [policy.within_request_cap(n) for n in range(4)] == [True, True, False, False]
    assert AdmissionPolicy(ActiveKVConfig(), slot_bytes=100).within_request_cap(10**9)


def test_scope_prompt_only_or_decode_too():
    prompt_only = AdmissionPolicy(ActiveKVConfig(), slot_bytes=1)
    with_decode = AdmissionPolicy(ActiveKVConfig(store_blocks="prompt_and_decode"), slot_bytes=1)
    # 10 full blocks computed, prompt of 70 tokens at block size 32: 2 prompt blocks.
    assert prompt_only.savable_blocks(10, 70, 32) == 2
    assert with_decode.savable_blocks(10, 70, 32) == 10
