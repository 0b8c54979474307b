"""The bound behaviour of the native module, beside the reference where they must agree."""

from __future__ import annotations

import inspect
import pickle

import activekv
import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from pipeline.vllm_driver import standalone

IMPLS = ["reference", "native"]


def test_connector_is_a_real_subclass_with_the_factory_signature():
    cls = activekv.ActiveKVHostConnector
    # Named apart from vLLM's own ActiveKVConnector (its runner's wrapper of
    # "the active connector"), with the older name kept as an alias.
    assert cls.__name__ == "ActiveKVHostConnector" and activekv.ActiveKVConnector is cls
    assert issubclass(cls, KVConnectorBase_V1)
    assert list(inspect.signature(cls).parameters) == ["vllm_config", "role", "kv_cache_config"]
    # Native all the way down: no method of ours is a Python function.
    ours = {n: v for n, v in vars(cls).items() if callable(v) and not n.startswith("__")}
    assert ours and not any(inspect.isfunction(v) for v in ours.values())


def test_register_makes_the_connector_known_by_name():
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    activekv.register()
    for name in ("ActiveKVHostConnector", "ActiveKVConnector"):
        found = KVConnectorFactory.get_connector_class(KVTransferConfig(kv_connector=name, kv_role="kv_both"))
        assert found is activekv.ActiveKVHostConnector


def test_sleep_mode_is_refused_by_name():
    # vLLM 0.33+ asks this when sleep mode is on and refuses a connector that
    # answers False, naming it; older vLLM never asks.
    assert activekv.ActiveKVHostConnector.supports_sleep_mode(None) is False


def test_features_report_what_this_vllm_offers():
    import dataclasses

    from vllm.config import CacheConfig
    from vllm.v1.core.sched.output import SchedulerOutput

    features = activekv.vllm_features()
    assert features["sync_kv_loads_flag"] == (
        "has_sync_kv_loads" in {f.name for f in dataclasses.fields(SchedulerOutput)}
    )
    assert features["extensible_kv_cache"] == ("enable_extensible_kv_cache" in CacheConfig.__dataclass_fields__)
    assert features["sleep_mode_hook"] == hasattr(KVConnectorBase_V1, "supports_sleep_mode")


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
    stats = activekv.ActiveKVHostConnector.build_kv_connector_stats({"hit_blocks": 2})
    total = stats.aggregate(activekv.ActiveKVStats(data={"hit_blocks": 3, "lookups": 1}))
    reduced = total.reduce()
    assert reduced["hit_blocks"] == 5 and reduced["lookups"] == 1 and reduced["stored_blocks"] == 0
    assert activekv.ActiveKVStats(data={}).is_empty() and not total.is_empty()


@pytest.mark.parametrize(
    "extra",
    [
        {"capacity": 1},
        {"capacity_bytes": "1G"},
        {"capacity_bytes": -1},
        {"mode": "lossy"},
        {"store_threshold": 0, "mode": "fast"},
        {"capacity_bytes": 100},
        {"capacity_bytes": 1 << 60},
        {"streaming": 2},
        {"streaming": {"resident": 1}},
        {"streaming": {"ring_size": 1}},
        {"streaming": {"resident_layers": 4}},
        {"streaming": {"resident_layers": 2, "ring_size": 2}},
    ],
    ids=[
        "unknown-key",
        "wrong-type",
        "negative",
        "unknown-mode",
        "two-bad-keys",
        "no-block",
        "more-than-the-host-has",
        "streaming-not-a-table",
        "streaming-unknown-key",
        "streaming-ring-of-one",
        "streaming-every-layer-resident",
        "streaming-saves-nothing",
    ],
)
def test_bad_config_same_message_in_both_engines(extra):
    messages = []
    for impl in IMPLS:
        with pytest.raises(ValueError) as err:
            standalone.make_pair(impl, extra, standalone.kv_cache_config())
        messages.append((type(err.value).__name__, str(err.value)))
    assert messages[0] == messages[1]  # the same class (by name) and message
    assert messages[0][0] == "ConfigError"
    assert "kv_connector_extra_config" in messages[0][1]


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


HOME_ROWS = 12  # rows_for(8): the homes of an 8-block cache


def _with_rows(blocks):
    """Blocks with home rows as a scheduler gives them, in row order: here
    block b lives in row 11 - b (rows are not block ids)."""
    pairs = sorted((HOME_ROWS - 1 - b, b) for b in blocks)
    return [b for _, b in pairs], [r for r, _ in pairs]


def _metadata(impl, loads=(), saves=(), awaiting=(), stage=(), writeback=(), rows=None):
    """`rows`: (stage rows, write-back rows) as given, else _with_rows's."""
    (stage, stage_rows), (writeback, writeback_rows) = _with_rows(stage), _with_rows(writeback)
    if rows is not None:
        stage_rows, writeback_rows = rows
    if impl == "native":
        meta = activekv.ActiveKVMetadata.__new__(activekv.ActiveKVMetadata)
        meta.loads, meta.saves, meta.awaiting_free = list(loads), list(saves), list(awaiting)
        if stage or writeback:
            meta.stage_blocks, meta.writeback_blocks = stage, writeback
            meta.stage_rows, meta.writeback_rows = stage_rows, writeback_rows
        return meta
    from activekv_reference.metadata import ActiveKVMetadata, LoadOp, SaveOp

    return ActiveKVMetadata(
        loads=[LoadOp(*op) for op in loads],
        saves=[SaveOp(*op) for op in saves],
        awaiting_free=list(awaiting),
        stage_blocks=stage,
        stage_rows=stage_rows,
        writeback_blocks=writeback,
        writeback_rows=writeback_rows,
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


def _full_graph_step(worker, meta, forward_context):
    """A step that replays a full CUDA graph: no per-layer call at all."""
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(forward_context)
    worker.wait_for_save()
    report = worker.build_connector_worker_meta()
    worker.clear_connector_metadata()
    return report


@pytest.mark.parametrize("runner", ["gpu-runner", "v1-runner"])
@pytest.mark.parametrize("impl", IMPLS)
def test_a_full_cuda_graph_step_loads_and_saves_what_the_hooks_would(impl, runner):
    from types import SimpleNamespace

    from vllm.config import CUDAGraphMode

    # What vLLM's forward context says of such a step: 0.26.0's GPU runner
    # binds no attention metadata for it, the V1 runner marks the forward FULL.
    forward_context = (
        SimpleNamespace(attn_metadata=None, cudagraph_runtime_mode=CUDAGraphMode.NONE)
        if runner == "gpu-runner"
        else SimpleNamespace(attn_metadata={}, cudagraph_runtime_mode=CUDAGraphMode.FULL)
    )
    save = _metadata(impl, saves=[(1, 3, b"a" * 32, "r"), (2, 4, b"b" * 32, "r")])
    hooked, hooked_kv = _registered_worker(impl)
    _step(hooked, hooked_kv, save)
    worker, kv = _registered_worker(impl)
    report = _full_graph_step(worker, save, forward_context)
    assert sorted(report.saved) == [1, 2] and not report.failed_saves
    assert standalone_store(worker) == standalone_store(hooked) != {}

    before = {n: t.clone() for n, t in kv.items()}
    report = _full_graph_step(worker, _metadata(impl, loads=[(2, 6, b"b" * 32), (1, 7, b"a" * 32)]), forward_context)
    assert report.loaded == [2, 1] and not report.failed_loads
    for name in kv:  # landed at start_load_kv: nothing waits for them later
        assert torch.equal(kv[name][6], before[name][4]) and torch.equal(kv[name][7], before[name][3])


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


# ---- layer streaming ------------------------------------------------------------

STREAMING = {"streaming": {"resident_layers": 1, "ring_size": 2}}


@pytest.mark.parametrize(
    "extra",
    [
        {"streaming": 2},
        {"streaming": [1, 2]},
        {"streaming": {"rings": 2}},
        {"streaming": {"ring_size": "2"}},
        {"streaming": {"ring_size": True}},
        {"streaming": {"ring_size": 1}},
        {"streaming": {"resident_layers": -1, "ring_size": 1}},
        {"streaming": {"x": 1}, "store_threshold": 0},
        {"streaming": {"resident_layers": 5}},
        {"streaming": {"resident_layers": 3}},
    ],
    ids=[
        "not-a-table",
        "a-list",
        "unknown-key",
        "wrong-type",
        "bool",
        "ring-too-small",
        "first-key-first",
        "other-keys-first",
        "no-layer-left",
        "saves-nothing",
    ],
)
def test_bad_streaming_config_same_message_in_both_engines(extra):
    cfg = standalone.kv_cache_config(num_layers=5)
    messages = []
    for impl in IMPLS:
        with pytest.raises(ValueError) as err:
            standalone.make_pair(impl, extra, cfg)
        messages.append((type(err.value).__name__, str(err.value)))
    assert messages[0] == messages[1]  # the same class (by name) and message
    assert messages[0][0] == "ConfigError"
    assert "kv_connector_extra_config" in messages[0][1]


def test_streaming_none_is_off_in_both_engines():
    cfg = standalone.kv_cache_config()
    for impl in IMPLS:
        _, worker = standalone.make_pair(impl, {"streaming": None}, cfg)
        assert worker.loads_before_kv_cache_update() is False


def _vllm_config(impl, extra, num_layers=5, **changes):
    config = standalone.vllm_config(extra, standalone.connector_class(impl).__name__, num_layers=num_layers)
    for path, value in changes.items():
        owner, name = path.split("__") if "__" in path else (None, path)
        setattr(getattr(config, owner) if owner else config, name, value)
    return config


def test_kv_cache_regions_are_the_same_in_both_engines():
    groups = standalone.kv_cache_config(num_layers=5).kv_cache_groups
    regions = [
        standalone.connector_class(impl).get_kv_cache_regions(_vllm_config(impl, STREAMING), groups) for impl in IMPLS
    ]
    assert regions[0] == regions[1]
    names = groups[0].layer_names
    assert regions[1] == [[names[0]], [names[1], names[3]], [names[2], names[4]]]
    for impl in IMPLS:
        assert standalone.connector_class(impl).get_kv_cache_regions(_vllm_config(impl, {}), groups) is None


@pytest.mark.parametrize(
    "changes",
    [
        {"model_config__use_mla": True},
        {"speculative_config": object()},
        {"parallel_config__pipeline_parallel_size": 2},
        {"model_config__get_num_layers_by_block_type": lambda p, t="attention": 7},
    ],
    ids=["mla", "speculative", "pipeline-parallel", "shared-kv"],
)
def test_unservable_settings_same_refusal_in_both_engines(changes):
    groups = standalone.kv_cache_config(num_layers=5).kv_cache_groups
    messages = []
    for impl in IMPLS:
        with pytest.raises(ValueError) as err:
            standalone.connector_class(impl).get_kv_cache_regions(_vllm_config(impl, STREAMING, **changes), groups)
        messages.append((type(err.value).__name__, str(err.value)))
    assert messages[0] == messages[1]
    assert messages[0][0] == "ConfigError"
    assert "layer streaming cannot serve" in messages[0][1]


def test_startup_report_is_logged_once_by_the_scheduler_with_the_reference_line(caplog):
    cfg = standalone.kv_cache_config(num_layers=5)
    lines = {}
    with caplog.at_level("INFO"):
        for impl, logger in [("reference", "vllm.activekv_reference"), ("native", "vllm.activekv")]:
            caplog.clear()
            scheduler, worker = standalone.make_pair(impl, STREAMING, cfg)
            lines[impl] = [r.getMessage() for r in caplog.records if r.name == logger]
            assert worker.loads_before_kv_cache_update() is True
            assert scheduler.loads_before_kv_cache_update() is False
    assert len(lines["native"]) == 1 and lines["native"] == lines["reference"]
    assert lines["native"][0].startswith("ActiveKV layer streaming: 1 resident + 4 streamed layers")


def test_streaming_metadata_is_plain_picklable_data():
    meta = _metadata("native", stage=[1, 4], writeback=[4])
    back = pickle.loads(pickle.dumps(meta))
    assert (back.stage_blocks, back.stage_rows) == ([4, 1], [7, 10])
    assert (back.writeback_blocks, back.writeback_rows) == ([4], [7])


def _ring_caches(cfg, seed=3):
    """KV caches whose streamed layers view two ring buffers, as vLLM makes them
    with the connector's regions (1 resident layer, a ring of 2)."""
    plain = standalone.kv_caches(cfg, seed)
    names = list(plain)
    rings = [plain[names[1]], plain[names[2]]]
    return {n: plain[n] if i == 0 else rings[(i - 1) % 2] for i, n in enumerate(names)}


def _streaming_worker(impl, cfg):
    _, worker = standalone.make_pair(impl, STREAMING, cfg)
    kv = _ring_caches(cfg)
    worker.register_kv_caches(kv)
    return worker, kv


def _streaming_step(worker, kv, meta, written, step):
    """One step as vLLM drives it with patch 0002: per layer, wait before the KV
    cache update, the update writes the step's blocks, wait again before
    attention, then save. Returns what each layer held after its first wait."""
    seen = {}
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)
    for i, (name, layer) in enumerate(kv.items()):
        worker.wait_for_layer_load(name)
        seen[name] = layer.clone()
        g = torch.Generator().manual_seed(100 * step + i)
        for b in written:
            layer[b] = torch.randn(layer[b].shape, generator=g).to(layer.dtype)
        worker.wait_for_layer_load(name)
        worker.save_kv_layer(name, layer, None)
    worker.wait_for_save()
    report = worker.build_connector_worker_meta()
    worker.clear_connector_metadata()
    return seen, report


def test_streaming_steps_are_bitwise_the_reference():
    from pipeline.parity.replay import streamed_homes

    cfg = standalone.kv_cache_config(num_layers=5, num_blocks=8)
    runs = {}
    for impl in IMPLS:
        worker, kv = _streaming_worker(impl, cfg)
        steps = [
            # prefill: writes blocks 1, 2 and 5; block 2 also saved to slot 3
            (dict(stage=[1, 2, 5], writeback=[1, 2, 5], saves=[(3, 2, b"a" * 32, "r")]), [1, 2, 5]),
            # decode: reads every block, writes block 5
            (dict(stage=[1, 2, 5], writeback=[5]), [5]),
            # a prefix hit: slot 3 loads into block 6 on top of its staged home
            (dict(stage=[1, 6, 7], writeback=[6, 7], loads=[(3, 6, b"a" * 32)]), [7]),
            # read back what went home
            (dict(stage=[1, 2, 5, 6, 7], writeback=[]), []),
        ]
        seen, per_step = [], []
        for step, (plan, written) in enumerate(steps):
            held, _ = _streaming_step(worker, kv, _metadata(impl, **plan), written, step)
            seen.append(held)
            # vLLM takes a worker's stats once a step: the step gauges are its bytes.
            data = worker.get_kv_connector_stats().data
            per_step.append({k: v for k, v in data.items() if not k.endswith("_us")})
        stats = {c: sum(d[c] for d in per_step) for c in per_step[0] if c != "gauges"}
        runs[impl] = (
            seen,
            streamed_homes(worker),
            standalone_store(worker),
            stats,
            worker.get_block_ids_with_load_errors(),
            per_step,
        )
    ref, nat = runs["reference"], runs["native"]
    for step, (a, b) in enumerate(zip(ref[0], nat[0], strict=False)):
        for name in a:
            assert torch.equal(a[name].view(torch.int16), b[name].view(torch.int16)), (step, name)
    assert nat[1] == ref[1] and len(nat[1]) == 4
    assert nat[2] == ref[2] and nat[2]
    for counter in ("streamed_bytes_to_device", "streamed_bytes_to_host", "loaded_blocks"):
        assert nat[3][counter] == ref[3][counter] and nat[3][counter] > 0, counter
    assert nat[4] == ref[4] == set()
    assert nat[5] == ref[5]
    nonzero = {"to_device": 0, "to_host": 0}
    for seq, step in enumerate(nat[5], start=1):
        for way in ("to_device", "to_host"):
            reported = step["gauges"].get(f"streamed_step_bytes_{way}")
            if reported is not None:  # else unchanged since the last step
                assert reported == {"worker0": [seq, step[f"streamed_bytes_{way}"]]}, (seq, way)
                nonzero[way] += reported["worker0"][1] > 0
    assert all(nonzero.values()), nonzero  # a step that streamed reported its bytes, each way
    # The last step stages and writes back nothing: its gauge says 0.
    assert nat[5][-1]["gauges"]["streamed_step_bytes_to_host"] == {"worker0": [4, 0]}


@pytest.mark.parametrize("impl", IMPLS)
def test_stage_block_out_of_range_is_refused_and_binds_nothing(impl):
    cfg = standalone.kv_cache_config(num_layers=5, num_blocks=8)
    worker, kv = _streaming_worker(impl, cfg)
    before = {n: t.clone() for n, t in kv.items()}
    with pytest.raises(IndexError, match=r"block id 8 out of range \(the KV cache has 8 blocks\)"):
        worker.bind_connector_metadata(_metadata(impl, stage=[1], writeback=[8]))
    assert all(torch.equal(kv[n], before[n]) for n in kv)


@pytest.mark.parametrize(
    "rows, message",
    [
        (([10], []), r"1 home rows for 2 streamed blocks"),
        (([9, 10], [HOME_ROWS]), rf"home row {HOME_ROWS} out of range \(the homes have {HOME_ROWS} rows\)"),
    ],
)
@pytest.mark.parametrize("impl", IMPLS)
def test_home_rows_that_do_not_fit_the_homes_are_refused_and_bind_nothing(impl, rows, message):
    cfg = standalone.kv_cache_config(num_layers=5, num_blocks=8)
    worker, kv = _streaming_worker(impl, cfg)
    before = {n: t.clone() for n, t in kv.items()}
    with pytest.raises(IndexError, match=message):
        worker.bind_connector_metadata(_metadata(impl, stage=[1, 2], writeback=[1], rows=rows))
    assert all(torch.equal(kv[n], before[n]) for n in kv)


def test_no_kv_cache_group_is_the_same_refusal_in_both_engines():
    messages = []
    for impl in IMPLS:
        with pytest.raises(ValueError) as err:
            standalone.connector_class(impl).get_kv_cache_regions(_vllm_config(impl, STREAMING), [])
        messages.append((type(err.value).__name__, str(err.value)))
    assert messages[0] == messages[1]
    assert "KV cache groups []" in messages[0][1]


def test_a_hybrid_model_is_the_same_refusal_in_both_engines():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    full = standalone.kv_cache_config().kv_cache_groups[0]
    sliding = SlidingWindowSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.bfloat16, sliding_window=128)
    cfg = KVCacheConfig(
        num_blocks=16,
        kv_cache_tensors=[],
        kv_cache_groups=[full, KVCacheGroupSpec(layer_names=["model.layers.4.self_attn.attn"], kv_cache_spec=sliding)],
    )
    standalone.ensure_distributed()
    messages = []
    for impl in IMPLS:
        cls = standalone.connector_class(impl)
        with pytest.raises(ValueError) as err:
            cls(standalone.vllm_config({}, cls.__name__), KVConnectorRole.WORKER, cfg)
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    # The words of streaming's refusal of the same groups (test_streaming_refusals.py).
    assert messages[0] == (
        "ActiveKV cannot serve KV cache groups ['FullAttentionSpec', 'SlidingWindowSpec']: "
        "it needs one full-attention group (no sliding-window or hybrid groups)"
    )


def test_vllm_features_are_what_the_installed_vllm_offers():
    import importlib.util

    import vllm

    features = activekv.vllm_features()
    assert features["version"] == vllm.__version__
    assert features["cache_hit_source"] == (importlib.util.find_spec("vllm.v1.metrics.cache_hit_source") is not None)
    assert features["layer_work_hook"] == hasattr(KVConnectorBase_V1, "has_layer_work")
    assert features["streaming_hooks"] == hasattr(KVConnectorBase_V1, "get_kv_cache_regions")
    assert features["piecewise_hook"] == hasattr(KVConnectorBase_V1, "requires_piecewise_for_cudagraph")


@pytest.mark.parametrize("impl", IMPLS)
def test_the_connector_asks_for_piecewise_graphs_and_for_hnd_only_when_streaming(impl):
    cls = standalone.connector_class(impl)
    piecewise = {
        name: cls.requires_piecewise_for_cudagraph(extra)
        for name, extra in {
            "default": {},
            "compressed": {"mode": "compressed"},
            "streaming": STREAMING,
            "bad": {"capacity": 1},
        }.items()
    }
    assert piecewise == {"default": False, "compressed": False, "streaming": True, "bad": False}
    layouts = {
        name: cls.get_required_kvcache_layout(standalone.vllm_config(extra, cls.__name__))
        for name, extra in {"exact": {"mode": "exact"}, "streaming": {"streaming": {}}, "bad": {"capacity": 1}}.items()
    }
    assert layouts == {"exact": None, "streaming": "HND", "bad": None}


def test_the_module_raises_its_own_value_errors_named_as_the_reference_names_them():
    import activekv
    import activekv_reference
    from activekv_reference.layout import UnsupportedLayoutError

    for name, reference in (
        ("ConfigError", activekv_reference.ConfigError),
        ("UnsupportedLayoutError", UnsupportedLayoutError),
    ):
        native = getattr(activekv, name)
        # One class to catch for every refusal, and still a ValueError.
        assert issubclass(native, activekv.Error) and issubclass(reference, activekv_reference.Error)
        assert issubclass(activekv.Error, ValueError) and issubclass(activekv_reference.Error, ValueError)
        assert native.__name__ == reference.__name__ == name
        assert native.__module__ == "activekv"
