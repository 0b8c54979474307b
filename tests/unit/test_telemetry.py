"""Telemetry in both engines (docs/metrics.md): the same names, counters and
gauges that survive vLLM's aggregation over steps and workers, the Prometheus
metrics with the configuration as an info metric, and what the scheduler and
the workers report step by step."""

from __future__ import annotations

import copy
import functools
from types import SimpleNamespace

import pytest
import torch  # noqa: F401  (before activekv, which links against torch's libraries)
import activekv
from activekv_reference import stats as ref
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pipeline.vllm_driver import standalone
from tests.unit.test_native_module import _step

IMPLS = ["reference", "native"]
STEP_GAUGE = "streamed_step_bytes_to_device"


def stats(impl, data):
    return standalone.connector_class(impl).build_kv_connector_stats(copy.deepcopy(data))


def gauges(**per_gauge):
    """data["gauges"]: each gauge as {source: [seq, value]}."""
    return {"gauges": {name: {s: list(e) for s, e in per.items()} for name, per in per_gauge.items()}}


# ---- names -------------------------------------------------------------------


def test_the_engines_export_the_same_names_help_and_labels():
    names = activekv.telemetry_names()
    assert names["counters"] == ref.COUNTERS
    assert names["gauges"] == ref.GAUGES
    assert names["info"] == {
        "name": ref.CONFIG_INFO,
        "help": ref.CONFIG_INFO_HELP,
        "labels": list(ref.CONFIG_INFO_LABELS),
    }
    assert list(names["counters"]) == list(ref.COUNTERS)  # the same order: the stats' dicts
    assert not set(ref.COUNTERS) & set(ref.GAUGES)


def test_no_value_of_the_configuration_is_a_counter():
    # The streaming geometry went from counters to gauges, its configuration
    # to the info metric's labels: a value summed by rate() means nothing.
    counters = activekv.telemetry_names()["counters"]
    assert not [n for n in counters if n.startswith("streaming_")]
    assert {"lookup_tokens", "hit_tokens"} <= set(counters)  # the hit ratio's rate, in PromQL
    assert {"resident_layers", "ring_size"} <= set(ref.CONFIG_INFO_LABELS)


# ---- ActiveKVStats: vLLM's aggregation ------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_a_gauge_takes_a_sources_latest_step_not_the_sum(impl):
    older = {"hit_tokens": 3, **gauges(store_blocks={"scheduler": (4, 10)})}
    newer = {"hit_tokens": 5, **gauges(store_blocks={"scheduler": (5, 12)})}
    for first, second in ((older, newer), (newer, older)):  # in either order
        reduced = stats(impl, first).aggregate(stats(impl, second)).reduce()
        assert reduced["store_blocks"] == 12, "a gauge was summed over steps"
        assert reduced["hit_tokens"] == 8, "a counter was not summed over steps"


@pytest.mark.parametrize("impl", IMPLS)
def test_the_workers_gauges_add_up_each_at_its_latest(impl):
    # vLLM's KVOutputAggregator: the first worker's stats take the others'.
    ranks = [stats(impl, gauges(**{STEP_GAUGE: {f"worker{r}": (5, 100 * (r + 1))}})) for r in range(2)]
    total = ranks[0].aggregate(ranks[1])
    assert total.reduce()[STEP_GAUGE] == 300
    # The scheduler's stats join them (vLLM's update_from_output).
    total = total.aggregate(stats(impl, gauges(store_blocks={"scheduler": (5, 7)})))
    assert total.reduce()[STEP_GAUGE] == 300 and total.reduce()["store_blocks"] == 7
    # A later step of worker 0 (vLLM's log line merges steps): it replaces
    # worker 0's value, worker 1's stays.
    total = total.aggregate(stats(impl, gauges(**{STEP_GAUGE: {"worker0": (6, 50)}})))
    assert total.reduce()[STEP_GAUGE] == 250


@pytest.mark.parametrize("impl", IMPLS)
def test_aggregate_leaves_what_it_merged_and_the_payload_as_they_were(impl):
    payload = {"hit_tokens": 1, **gauges(store_blocks={"scheduler": (1, 3)})}
    other = {"hit_tokens": 2, **gauges(store_blocks={"scheduler": (2, 4)}, **{STEP_GAUGE: {"worker0": (2, 9)}})}
    mine = standalone.connector_class(impl).build_kv_connector_stats(payload)  # as vLLM builds it
    theirs = stats(impl, other)
    before_payload, before_theirs = copy.deepcopy(payload), copy.deepcopy(theirs.data)
    mine.aggregate(theirs)
    assert payload == before_payload, "aggregate changed the step's payload"
    assert theirs.data == before_theirs


@pytest.mark.parametrize("impl", IMPLS)
def test_a_reported_gauge_alone_is_not_empty_and_reset_clears_it(impl):
    assert stats(impl, {}).is_empty()
    s = stats(impl, gauges(store_blocks={"scheduler": (1, 0)}))  # a value of 0 is still a report
    assert not s.is_empty()
    assert s.reduce()["store_blocks"] == 0
    s.reset()
    assert s.is_empty() and "store_blocks" not in s.reduce()
    # Counters are always in the reduction; gauges only when reported.
    assert set(stats(impl, {}).reduce()) == set(ref.COUNTERS)


@pytest.mark.parametrize("impl", IMPLS)
def test_vllms_log_line_shows_a_gauges_latest_value_over_its_interval(impl):
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging

    module, name = standalone.IMPLEMENTATIONS[impl]
    logging = KVConnectorLogging(
        KVTransferConfig(kv_connector=name, kv_connector_module_path=module, kv_role="kv_both")
    )
    for seq, blocks in enumerate([10, 11, 12], start=1):
        logging.observe({"hit_tokens": 2, **gauges(store_blocks={"scheduler": (seq, blocks)})})
    lines = []
    logging.log(log_fn=lambda fmt, *args: lines.append(fmt % args))
    assert len(lines) == 1
    assert "store_blocks=12" in lines[0] and "hit_tokens=6" in lines[0]


# ---- Prometheus ----------------------------------------------------------------


def prom(impl, extra=None, engines=(0,)):
    registry = CollectorRegistry()
    types = {t: functools.partial(t, registry=registry) for t in (Gauge, Counter, Histogram)}
    cls = standalone.connector_class(impl)
    metrics = cls.build_prom_metrics(
        standalone.vllm_config(extra or {}, cls.__name__),
        types,
        ["model_name", "engine"],
        {e: ["tiny", str(e)] for e in engines},
    )
    return metrics, registry


def sample(registry, name, engine=0):
    return registry.get_sample_value(name, {"model_name": "tiny", "engine": str(engine)})


@pytest.mark.parametrize("impl", IMPLS)
def test_prometheus_gauges_are_each_sources_latest_summed_and_counters_add(impl):
    metrics, reg = prom(impl)
    metrics.observe(
        {
            "hit_tokens": 4,
            **gauges(store_blocks={"scheduler": (1, 10)}, **{STEP_GAUGE: {"worker0": (1, 100), "worker1": (1, 100)}}),
        },
        0,
    )
    assert sample(reg, "vllm:activekv_store_blocks") == 10
    assert sample(reg, f"vllm:activekv_{STEP_GAUGE}") == 200
    # The next step: worker 1 alone reports (worker 0's value is unchanged).
    metrics.observe(
        {"hit_tokens": 4, **gauges(store_blocks={"scheduler": (2, 12)}, **{STEP_GAUGE: {"worker1": (2, 40)}})}, 0
    )
    assert sample(reg, "vllm:activekv_store_blocks") == 12, "a gauge was summed over steps"
    assert sample(reg, f"vllm:activekv_{STEP_GAUGE}") == 140
    assert sample(reg, "vllm:activekv_hit_tokens_total") == 8
    # A step that reports no gauge, and an older report arriving late, change nothing.
    metrics.observe({"hit_tokens": 0, "gauges": {}}, 0)
    metrics.observe(gauges(store_blocks={"scheduler": (1, 10)}), 0)
    assert sample(reg, "vllm:activekv_store_blocks") == 12
    # Stats without a "gauges" key (an older engine's) are still counted.
    metrics.observe({"hit_tokens": 1}, 0)
    assert sample(reg, "vllm:activekv_hit_tokens_total") == 9


@pytest.mark.parametrize("impl", IMPLS)
def test_each_engine_keeps_its_own_gauges(impl):
    metrics, reg = prom(impl, engines=(0, 1))
    metrics.observe(gauges(store_blocks={"scheduler": (1, 5)}), 0)
    metrics.observe(gauges(store_blocks={"scheduler": (1, 7)}), 1)
    assert (sample(reg, "vllm:activekv_store_blocks", 0), sample(reg, "vllm:activekv_store_blocks", 1)) == (5, 7)


def _info(registry):
    return [s for m in registry.collect() if m.name == "vllm:activekv_config_info" for s in m.samples]


@pytest.mark.parametrize("impl", IMPLS)
def test_the_configuration_is_one_info_metric_set_to_one(impl):
    extra = {
        "mode": "compressed",
        "capacity_bytes": 1 << 28,
        "store_threshold": 2,
        "streaming": {"resident_layers": 1, "ring_size": 3},
    }
    _, reg = prom(impl, extra)
    [info] = _info(reg)
    assert info.value == 1
    assert info.labels == {
        "model_name": "tiny",
        "engine": "0",
        "mode": "compressed",
        "capacity_bytes": str(1 << 28),
        "store_threshold": "2",
        "max_bytes_per_request": "0",
        "store_blocks": "prompt",
        "fence_timeout_ms": "30000",
        "store_path_set": "false",
        "streaming": "true",
        "resident_layers": "1",
        "ring_size": "3",
        "homes": "exact",
        "async_load_min_tokens": "0",
    }
    _, reg = prom(impl, {"async_load_min_tokens": 96})
    [info] = _info(reg)
    assert info.labels["async_load_min_tokens"] == "96"
    _, reg = prom(impl, {"store_path": "/some/where/store"})
    [info] = _info(reg)
    assert info.labels["store_path_set"] == "true" and info.labels["streaming"] == "false"
    assert (info.labels["resident_layers"], info.labels["ring_size"], info.labels["homes"]) == ("", "", "")
    assert not any("/some/where" in v for v in info.labels.values()), "a label carries the store path"


def test_both_engines_register_the_same_prometheus_metrics():
    families = {}
    for impl in IMPLS:
        _, reg = prom(impl)
        families[impl] = {(m.name, m.type, m.documentation) for m in reg.collect()}
    assert families["native"] == families["reference"]
    expected = (
        {(f"vllm:activekv_{n}", "counter", h) for n, h in ref.COUNTERS.items()}
        | {(f"vllm:activekv_{n}", "gauge", h) for n, h in ref.GAUGES.items()}
        | {(f"vllm:activekv_{ref.CONFIG_INFO}", "gauge", ref.CONFIG_INFO_HELP)}
    )
    assert families["native"] == expected


# ---- what the sides report, step by step -----------------------------------------


class _Blocks:
    def __init__(self, ids):
        self._ids = ids

    def get_block_ids(self):
        return (self._ids,)


def _request(rid, tokens):
    return SimpleNamespace(request_id=rid, all_token_ids=list(tokens), num_prompt_tokens=len(tokens), cache_salt=None)


def _new_step(rid, blocks, computed, scheduled):
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=rid, block_ids=(blocks,), num_computed_tokens=computed)],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[]
        ),
        num_scheduled_tokens={rid: scheduled},
        finished_req_ids=set(),
    )


def _untimed(s):
    """A stats object's data without the time counters (not the same run to run)."""
    if s is None:
        return None
    return {k: v for k, v in s.data.items() if not k.endswith("_us")}


def _session(impl, extra, cfg):
    """Two requests with the same 100-token prompt, one after the other, as
    vLLM drives the connectors; the stats each side reports along the way."""
    from vllm.v1.outputs import KVConnectorOutput

    sched, worker = standalone.make_pair(impl, extra, cfg)
    kv = standalone.kv_caches(cfg)
    worker.register_kv_caches(kv)
    reports = [("start", _untimed(sched.get_kv_connector_stats()), _untimed(worker.get_kv_connector_stats()))]
    prompt = range(1000, 1100)
    for rid, blocks in (("a", [0, 1, 2, 3]), ("b", [4, 5, 6, 7])):
        request = _request(rid, prompt)
        hit, _ = sched.get_num_new_matched_tokens(request, 0)
        sched.update_state_after_alloc(request, _Blocks(blocks), hit)
        wm = _step(worker, kv, sched.build_connector_meta(_new_step(rid, blocks, hit, len(prompt) - hit)))
        worker_stats = _untimed(worker.get_kv_connector_stats())
        sched.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=wm))
        reports.append((rid, _untimed(sched.get_kv_connector_stats()), worker_stats))
    reports.append(("idle", _untimed(sched.get_kv_connector_stats()), _untimed(worker.get_kv_connector_stats())))
    return reports


def test_the_scheduler_and_workers_report_the_same_in_both_engines():
    cfg = standalone.kv_cache_config(num_blocks=16)
    runs = {impl: _session(impl, {}, cfg) for impl in IMPLS}
    assert runs["native"] == runs["reference"]
    (_, start, start_worker), (_, a, a_worker), (_, b, _), (_, idle, idle_worker) = runs["native"]
    g = {name: per["scheduler"] for name, per in start["gauges"].items()}
    capacity = g["store_capacity_bytes"][1]
    assert 0 < capacity <= 1 << 30  # capacity_bytes' whole blocks
    assert g["store_free_bytes"][1] == capacity and g["store_used_bytes"][1] == 0 and g["store_blocks"][1] == 0
    assert "store_hit_ratio" not in g  # nothing looked up yet
    assert start_worker is None and idle_worker is None  # no streaming: a worker has no gauge
    # Request a: 3 full prompt blocks looked up (the 4th holds the last token),
    # saved and sealed in its step.
    assert a["lookups"] == 1 and a["lookup_tokens"] == 96 and a["hit_tokens"] == 0
    assert a["stored_blocks"] == 3 and a["gauges"]["store_blocks"]["scheduler"][1] == 3
    slot = a_worker["bytes_to_host"] // a_worker["saved_blocks"]  # one worker (tp 1)
    used = a["gauges"]["store_used_bytes"]["scheduler"][1]
    assert used == 3 * slot and used + a["gauges"]["store_free_bytes"]["scheduler"][1] == capacity
    assert capacity % slot == 0
    assert a["gauges"]["store_hit_ratio"]["scheduler"][1] == 0.0
    assert "store_capacity_bytes" not in a["gauges"]  # unchanged: not reported again
    # Request b: the same 96 tokens hit; 96 of 192 since start-up.
    assert b["lookup_tokens"] == 96 and b["hit_tokens"] == 96
    assert b["gauges"] == {"store_hit_ratio": {"scheduler": [3, 0.5]}}
    assert idle is None  # nothing moved, nothing changed


def test_the_streaming_geometry_is_reported_once_as_gauges_in_both_engines():
    cfg = standalone.kv_cache_config(num_layers=5, num_blocks=8)
    extra = {"streaming": {"resident_layers": 1, "ring_size": 2}}
    first = {}
    for impl in IMPLS:
        sched, _ = standalone.make_pair(impl, extra, cfg)
        first[impl] = sched.get_kv_connector_stats().data
        assert sched.get_kv_connector_stats() is None  # reported once
    assert first["native"] == first["reference"]
    geometry = {n: per["scheduler"][1] for n, per in first["native"]["gauges"].items() if n.startswith("streaming_")}
    assert geometry["streaming_streamed_layers"] == 4
    assert set(geometry) == {n for n in ref.GAUGES if n.startswith("streaming_")}
    assert not any(first["native"][n] for n in ref.COUNTERS), "the geometry was counted"


def test_may_load_async_is_the_same_answer_in_both_engines_and_follows_the_threshold():
    # vLLM 0.34 asks it as a request enters the queue (--max-num-inflight-kv-loads).
    cfg = standalone.kv_cache_config(num_blocks=16)
    bs = cfg.kv_cache_groups[0].kv_cache_spec.block_size
    lengths = range(1, 5 * bs)
    answers = {}
    for impl in IMPLS:
        sched, _ = standalone.make_pair(impl, {"async_load_min_tokens": 2 * bs}, cfg)
        answers[impl] = [sched.may_load_async(_request("r", range(n))) for n in lengths]
        off, _ = standalone.make_pair(impl, {}, cfg)  # none unless asked for
        assert not any(off.may_load_async(_request("r", range(n))) for n in lengths)
    assert answers["native"] == answers["reference"]
    yes = [n for n, a in zip(lengths, answers["native"], strict=True) if a]
    # Two full blocks must lie below the block of the last prompt token.
    assert yes and yes == list(range(yes[0], lengths[-1] + 1)) and yes[0] == 2 * bs + 1
