"""The patch stage's own check of a patched vLLM (pipeline/vllm_driver/patch_check.py)
catches a block served with other bytes, and a request's own blocks served at
each other's positions, with tokens alone (no logprobs on a host without a
C++ compiler): the device KV's bytes at each block's position are its oracle."""

import pytest

from pipeline.vllm_driver import patch_check
from tests.vllm.wrong_block import WRONG_BLOCK

pytestmark = pytest.mark.vllm


SWAPPED_BLOCKS = pytest.param(
    "swapped-blocks",
    marks=pytest.mark.xfail(
        strict=True, raises=AssertionError, reason="planted bug: a request's blocks reloaded in pairs swapped"
    ),
)


@pytest.mark.parametrize("connector", ["native", WRONG_BLOCK, SWAPPED_BLOCKS])
def test_the_patch_check_fails_on_a_block_served_with_other_bytes(tiny_model, connector):
    _, _, failures = patch_check.reload_check(tiny_model, connector)
    assert not failures, failures
