"""The same-shape oracle of a reload (vLLM's own prefix hits): bit for bit, and
under CI never a tokens-only comparison."""

from __future__ import annotations

import pytest

from pipeline.vllm_driver import comparison


def result(first_logprob: float) -> comparison.Result:
    # Two greedy steps with clear margins; only the first step's logprob varies.
    return comparison.Result((5, 6), 32, (((5, first_logprob), (7, -9.0)), ((6, -0.5), (8, -9.0))))


def test_a_reload_equal_to_vllms_agreeing_prefix_hits_passes_bit_for_bit(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert comparison.check_against_own_prefix_hits(result(-0.1), [result(-0.1), result(-0.1)]) == ""


def test_a_reload_one_ulp_off_fails():
    with pytest.raises(AssertionError, match="differs from vLLM's own prefix hit"):
        comparison.check_against_own_prefix_hits(result(-0.1000001), [result(-0.1), result(-0.1)])


def test_outside_ci_prefix_hits_that_disagree_fall_back_to_tokens_and_say_so(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    note = comparison.check_against_own_prefix_hits(result(-0.1), [result(-0.1), result(-0.2)])
    assert "tokens compared only" in note


def test_under_ci_prefix_hits_that_disagree_fail_instead_of_comparing_tokens(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(AssertionError, match="CI takes no tokens-only check"):
        comparison.check_against_own_prefix_hits(result(-0.1), [result(-0.1), result(-0.2)])
