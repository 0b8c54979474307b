"""@catches_a_wrong_block: a test that runs against both implementations and
against the reference with a bug planted that serves another stored block on
every load (pipeline/vllm_driver/planted_bug.py). On the planted bug the test must
fail with an AssertionError; one that passes on it fails the run (strict xfail)."""

import pytest

from pipeline.vllm_driver import llm as h

WRONG_BLOCK = pytest.param(
    "wrong-block",
    marks=pytest.mark.xfail(
        strict=True, raises=AssertionError, reason="planted bug: every load serves another stored block"
    ),
)
catches_a_wrong_block = pytest.mark.parametrize(
    "connector", [*sorted(h.CONNECTORS), WRONG_BLOCK], indirect=True, scope="module"
)
