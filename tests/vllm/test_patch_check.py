"""The patch stage's own check of a patched vLLM (pipeline/harness/patch_check.py)
catches a block served with other bytes, with tokens alone (no logprobs on a
host without a C++ compiler): the device KV's bytes are its oracle."""

import pytest

from pipeline.harness import patch_check
from tests.vllm.wrong_block import WRONG_BLOCK

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("connector", ["native", WRONG_BLOCK])
def test_the_patch_check_fails_on_a_block_served_with_other_bytes(tiny_model, connector):
    _, _, failures = patch_check.reload_check(tiny_model, connector)
    assert not failures, failures
