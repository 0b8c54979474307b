"""HookClock: the CPU streaming benchmark's split of a step's time
(bench/hook_times.py)."""

import gc
import time

import pytest

from bench.hook_times import GC_LABELS, HookClock


class Runner:
    def forward(self, seconds: float) -> str:
        time.sleep(seconds)
        return "out"

    def fail(self) -> None:
        raise KeyError("planted")


def test_times_and_counts_calls_while_entered_and_restores_the_methods():
    forward, fail = Runner.__dict__["forward"], Runner.__dict__["fail"]
    runner = Runner()
    with HookClock([(Runner, "forward", "model"), (Runner, "fail", "bad")]) as clock:
        assert runner.forward(0.02) == "out"
        runner.forward(0.01)
        with pytest.raises(KeyError, match="planted"):  # raised through, and still counted
            runner.fail()
        inside = clock.snapshot()
    assert (clock.calls["model"], clock.calls["bad"]) == (2, 1)
    assert 0.03 <= inside["model"] < 1.0
    assert Runner.__dict__["forward"] is forward and Runner.__dict__["fail"] is fail
    runner.forward(0.01)  # outside: not counted
    assert clock.calls["model"] == 2 and clock.snapshot() == inside


def test_a_snapshot_is_a_copy_so_differences_give_a_stretch():
    with HookClock([(Runner, "forward", "model")]) as clock:
        before = clock.snapshot()
        Runner().forward(0.01)
        after = clock.snapshot()
    assert before["model"] == 0.0 and after["model"] >= 0.01


class Child(Runner):
    @staticmethod
    def helper() -> int:
        return 1


@pytest.mark.parametrize("name", ["forward", "helper", "absent"])
def test_a_target_not_a_function_of_the_class_itself_wraps_nothing(name):
    """Inherited (its timing would land on the base class), static, or missing
    in this vLLM: refused before any method is wrapped."""
    forward = Runner.__dict__["forward"]
    with pytest.raises(ValueError, match=f"Child.{name} is not a method of that class itself"):
        with HookClock([(Runner, "forward", "model"), (Child, name, "x")]):
            pass
    assert Runner.__dict__["forward"] is forward


def test_times_the_garbage_collector_by_generation_while_entered():
    gc.disable()  # no automatic collection inside: only the ones asked for below
    try:
        with HookClock([(Runner, "forward", "model")]) as clock:
            gc.collect(1)
            gc.collect(2)
            gc.collect(2)
    finally:
        gc.enable()
    assert [clock.calls[label] for label in GC_LABELS] == [0, 1, 2]
    assert clock.seconds[GC_LABELS[2]] > 0.0 and clock.seconds[GC_LABELS[0]] == 0.0
    gc.collect(2)  # outside: not counted, and the callback is gone
    assert clock.calls[GC_LABELS[2]] == 2
