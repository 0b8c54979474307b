"""The bound behaviour of the native module, beside the reference where they must agree."""

from __future__ import annotations

import inspect
import pickle

import activekv
import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from pipeline import standalone

IMPLS = ["reference", "native"]


def test_connector_is_a_real_subclass_with_the_factory_signature():
    cls = activekv.ActiveKVConnector
    assert issubclass(cls, KVConnectorBase_V1)
    assert list(inspect.signature(cls).parameters) == ["vllm_config", "role", "kv_cache_config"]
    # Native all the way down: no method of ours is a Python function.
    ours = {n: v for n, v in vars(cls).items() if callable(v) and not n.startswith("__")}
    assert ours and not any(inspect.isfunction(v) for v in ours.values())


def test_register_makes_the_connector_known_by_name():
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    activekv.register()
    found = KVConnectorFactory.get_connector_class(
        KVTransferConfig(kv_connector="ActiveKVConnector", kv_role="kv_both")
    )
    assert found is activekv.ActiveKVConnector


def test_metadata_is_plain_picklable_data():
    meta = activekv.ActiveKVMetadata.__new__(activekv.ActiveKVMetadata)
    meta.loads, meta.saves, meta.awaiting_free = [(1, 2, b"k" * 32)], [], ["r"]
    back = pickle.loads(pickle.dumps(meta))
    assert type(back) is activekv.ActiveKVMetadata
    assert (back.loads, back.awaiting_free) == ([(1, 2, b"k" * 32)], ["r"])


def test_worker_metadata_aggregates_over_ranks():
    def wm(saved):
        m = activekv.ActiveKVWorkerMetadata.__new__(activekv.ActiveKVWorkerMetadata)
        m.saved, m.failed_saves, m.loaded, m.failed_loads, m.quarantined = saved, [], [], [], []
        return m

    assert wm([1, 2]).aggregate(wm([3])).saved == [1, 2, 3]
    with pytest.raises(TypeError, match="cannot aggregate"):
        wm([1]).aggregate(object())


def test_stats_sum_and_reduce_every_counter():
    stats = activekv.ActiveKVConnector.build_kv_connector_stats({"hit_blocks": 2})
    total = stats.aggregate(activekv.ActiveKVStats(data={"hit_blocks": 3, "lookups": 1}))
    reduced = total.reduce()
    assert reduced["hit_blocks"] == 5 and reduced["lookups"] == 1 and reduced["stored_blocks"] == 0
    assert activekv.ActiveKVStats(data={}).is_empty() and not total.is_empty()


@pytest.mark.parametrize(
    "extra",
    [{"capacity": 1}, {"capacity_bytes": "1G"}, {"capacity_bytes": -1}, {"mode": "lossy"},
     {"store_threshold": 0, "mode": "fast"}, {"capacity_bytes": 100}, {"capacity_bytes": 1 << 60}],
    ids=["unknown-key", "wrong-type", "negative", "unknown-mode", "two-bad-keys", "no-block",
         "more-than-the-host-has"],
)
def test_bad_config_same_message_in_both_engines(extra):
    messages = []
    for impl in IMPLS:
        with pytest.raises(ValueError) as err:
            standalone.make_pair(impl, extra, standalone.kv_cache_config())
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert "kv_connector_extra_config" in messages[0]


@pytest.mark.parametrize("impl", IMPLS)
def test_block_id_out_of_range_is_a_clear_error_and_changes_nothing(impl):
    worker, kv = _registered_worker(impl)
    before = {n: t.clone() for n, t in kv.items()}
    meta = _metadata(impl, saves=[(0, 99, b"k" * 32, "r")])
    with pytest.raises(IndexError, match="block id 99 out of range"):
        worker.bind_connector_metadata(meta)
    assert all(torch.equal(kv[n], before[n]) for n in kv)
    assert standalone_store(worker) == {}


def _registered_worker(impl):
    """A worker-side connector of `impl` with its 8-block KV caches registered."""
    cfg = standalone.kv_cache_config(num_blocks=8)
    _, worker = standalone.make_pair(impl, {}, cfg)
    kv = standalone.kv_caches(cfg)
    worker.register_kv_caches(kv)
    return worker, kv


def _metadata(impl, loads=(), saves=(), awaiting=()):
    if impl == "native":
        meta = activekv.ActiveKVMetadata.__new__(activekv.ActiveKVMetadata)
        meta.loads, meta.saves, meta.awaiting_free = list(loads), list(saves), list(awaiting)
        return meta
    from activekv_reference.metadata import ActiveKVMetadata, LoadOp, SaveOp

    return ActiveKVMetadata(
        loads=[LoadOp(*op) for op in loads], saves=[SaveOp(*op) for op in saves],
        awaiting_free=list(awaiting),
    )


def standalone_store(worker):
    from pipeline.parity.replay import store_bytes

    return store_bytes(worker)


def _step(worker, kv, meta):
    """One model step as vLLM drives it, with the step's report taken."""
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)
    for name, layer in kv.items():
        worker.wait_for_layer_load(name)
        worker.save_kv_layer(name, layer, None)
    worker.wait_for_save()
    report = worker.build_connector_worker_meta()
    worker.clear_connector_metadata()
    return report


@pytest.mark.parametrize("impl", IMPLS)
def test_a_refused_load_is_reported_once_by_its_device_block(impl):
    worker, kv = _registered_worker(impl)
    _step(worker, kv, _metadata(impl, saves=[(2, 4, b"a" * 32, "r")]))
    assert worker.get_block_ids_with_load_errors() == set()
    # Slot 2 holds block "a": a load that expects "b" there is refused.
    report = _step(worker, kv, _metadata(impl, loads=[(2, 6, b"b" * 32)]))
    assert report.failed_loads == [2]
    assert worker.get_block_ids_with_load_errors() == {6}
    assert worker.get_block_ids_with_load_errors() == set()  # taken: reported once
