"""The reference's Telemetry: what a side's take reports (the engine's
telemetry.h and its test_scheduler_side.cpp say the same)."""

from activekv_reference.stats import COUNTERS, GAUGES, Telemetry


def test_a_take_reports_the_counts_since_the_last_and_resets_them():
    t = Telemetry("scheduler")
    t.add("hit_tokens", 3)
    t.add("hit_tokens", 4)
    first = t.take()
    assert first.data["hit_tokens"] == 7 and first.data["gauges"] == {}
    assert set(first.data) == {*COUNTERS, "gauges"}
    assert t.take() is None  # nothing since


def test_a_gauge_is_reported_when_it_changed_with_its_takes_number():
    t = Telemetry("worker1")
    t.set("store_blocks", 0)
    assert t.take().data["gauges"] == {"store_blocks": {"worker1": [1, 0]}}  # a first value is news
    t.set("store_blocks", 0)
    assert t.take() is None  # the same value: nothing to report
    t.set("store_blocks", 5)
    t.set("store_blocks", 6)  # set twice between takes: the last value
    assert t.take().data["gauges"] == {"store_blocks": {"worker1": [3, 6]}}
    t.add("lookups", 1)
    assert t.take().data["gauges"] == {}  # a counter moved, no gauge changed


def test_gauges_are_reported_in_the_declared_order():
    t = Telemetry("scheduler")
    for name in reversed(list(GAUGES)):
        t.set(name, 1)
    assert list(t.take().data["gauges"]) == list(GAUGES)
