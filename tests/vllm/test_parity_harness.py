"""The parity harness on a real recording: it passes equal engines, catches a
difference, and refuses recordings it cannot replay."""

from __future__ import annotations

import copy

import pytest

from pipeline.parity.cells import judge
from pipeline.parity.replay import ReplayError, TraceMismatchError, replay
from pipeline.parity.trace import read_traces
from pipeline.parity.workloads import Session, full_hit, miss, record_session

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def recording(tiny_model, tmp_path_factory):
    directory = tmp_path_factory.mktemp("recording")
    session = Session("small", {"mode": "exact"}, [("miss", miss), ("full hit", full_hit)])
    record_session(tiny_model, session, directory)
    return read_traces(directory)


def test_native_replay_matches_the_reference_bit_for_bit(recording):
    sched, worker = recording
    ref1, ref2, native = (replay(sched, worker, i) for i in ("reference", "reference", "native"))
    for scenario in ("miss", "full hit"):
        cell = judge(
            "exact",
            scenario,
            ref1.observations[scenario],
            ref2.observations[scenario],
            native.observations[scenario],
            ref1.live_differs[scenario],
        )
        assert (cell.gating, cell.result, cell.note) == (True, "pass", "live run: equal"), cell.detail
    assert any(what == "loaded" for what, _ in ref1.observations["full hit"])  # a real hit


def test_a_changed_block_fails_the_cell(recording):
    sched, worker = recording
    tampered = copy.deepcopy(worker)
    save = next(e for e in tampered if e["kind"] == "save_kv_layer" and e["segment"] == "miss")
    save["blocks"][0].view(-1)[0] += 1  # one value of one saved block
    ref = replay(sched, worker, "reference").observations["miss"]
    other = replay(sched, tampered, "native").observations["miss"]
    cell = judge("exact", "miss", ref, ref, other)
    assert cell.result == "FAIL" and "host store" in cell.detail


def test_recording_of_another_model_is_refused(recording):
    sched, worker = recording
    with pytest.raises(TraceMismatchError, match="not 'another-model'"):
        replay(sched, worker, "native", model_identity="another-model")


def test_truncated_worker_trace_is_refused(recording):
    sched, worker = recording
    binds = [i for i, e in enumerate(worker) if e["kind"] == "bind_connector_metadata"]
    with pytest.raises(TraceMismatchError, match="worker trace ends"):
        replay(sched, worker[: binds[1]], "native")


def test_an_engine_that_fails_in_its_replay_is_named_with_where(recording):
    # A hit the store never held: the alloc asks to load one block more than
    # the recording's hit, which neither engine has saved.
    sched, worker = recording
    tampered = copy.deepcopy(sched)
    alloc = next(
        e
        for e in tampered
        if e["kind"] == "update_state_after_alloc" and e["segment"] == "full hit" and e["num_external_tokens"]
    )
    alloc["num_external_tokens"] += 32
    with pytest.raises(
        ReplayError,
        match=r"^replay of the native engine without per-layer hooks \(full CUDA graph\), segment 'full hit', "
        r"step \d+, at update_state_after_alloc: \w+",
    ):
        replay(tampered, worker, "native", layer_hooks=False)
