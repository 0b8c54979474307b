"""Telemetry, through vLLM's connector stats and Prometheus metrics.

docs/metrics.md is the operator's account of every name below.

Both sides report: the scheduler (lookups, hits, admission, eviction, and the
host store's occupancy) and each worker (bytes moved, blocks written and read,
time spent, layer streaming's bytes of the step). vLLM aggregates the stats of
the workers and the scheduler each step, and (its log line) of several steps.

Counters count what happened since the side's last take; aggregate sums them;
Prometheus shows each as ``vllm:activekv_<name>_total``.

Gauges are values now. A side reports a gauge only when it changed since its
last take, under ``data["gauges"][name][source] = [seq, value]``: ``source``
is ``"scheduler"`` or ``"worker<rank>"``, ``seq`` the number of the side's
take. aggregate keeps each source's latest (highest seq) value, so steps of
one source replace each other and sources add up; Prometheus shows
``vllm:activekv_<name>``, set to the sum over the sources of each one's
latest value, remembered per engine. Byte gauges are of every worker: the
scheduler's store and geometry gauges multiply a worker's bytes by
tensor_parallel_size; each worker reports its own streamed bytes.

The configuration is one info metric, ``vllm:activekv_config_info``, a gauge
set to 1 whose labels are CONFIG_INFO_LABELS.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

PREFIX = "vllm:activekv_"

COUNTERS: dict[str, str] = {
    "lookups": "Requests looked up in the host store",
    "lookup_tokens": "Tokens the host store could have served to the requests looked up "
    "(full prompt blocks past vLLM's own prefix hit)",
    "hit_blocks": "Blocks served from the host store",
    "hit_tokens": "Tokens served from the host store",
    "stored_blocks": "Blocks whose save completed and became visible",
    "evicted_blocks": "Blocks evicted from the host store (LRU)",
    "rejected_threshold": "Blocks not stored: seen fewer times than store_threshold",
    "rejected_request_cap": "Blocks not stored: request over max_bytes_per_request",
    "rejected_full": "Blocks not stored: every slot pending or pinned",
    "saved_blocks": "Blocks written to host memory by workers",
    "loaded_blocks": "Blocks read from host memory by workers",
    "async_loaded_blocks": "Of loaded_blocks, those loaded while vLLM kept their request out of the batch "
    "(async_load_min_tokens)",
    "failed_loads": "Blocks whose load failed (recomputed by vLLM)",
    "bytes_to_host": "Bytes written to the host store",
    "bytes_to_device": "Bytes read from the host store",
    "save_us": "Microseconds the workers spent saving blocks (on a GPU: issuing copies that run on a copy stream)",
    "load_us": "Microseconds the workers spent loading blocks (on a GPU: issuing copies that run on a copy stream)",
    "quarantined_fences": "Transfer fences with an unknown outcome; their staging is never reused",
    "streamed_bytes_to_device": "Layer streaming: bytes staged from the homes into the ring",
    "streamed_bytes_to_host": "Layer streaming: bytes written back from the ring to the homes",
    "stream_us": "Layer streaming: microseconds spent staging and writing back",
}

GAUGES: dict[str, str] = {
    # The scheduler's: the host store (its index) after the step.
    "store_blocks": "Blocks in the host store that lookups find",
    "store_used_bytes": "Host store bytes taken (stored blocks, saves in flight, quarantined slots), all workers",
    "store_free_bytes": "Host store bytes free, all workers",
    "store_capacity_bytes": "Host store bytes in all (whole blocks of capacity_bytes), all workers",
    "store_hit_ratio": "Host store hit ratio since start-up: hit_tokens / lookup_tokens",
    # Each worker's: layer streaming's bytes of the step.
    "streamed_step_bytes_to_device": "Layer streaming: bytes staged from the homes into the ring in the last step, "
    "all workers",
    "streamed_step_bytes_to_host": "Layer streaming: bytes written back from the ring to the homes in the last step, "
    "all workers",
    # The scheduler's, once at start-up: the streaming geometry (StartupReport).
    "streaming_streamed_layers": "Layer streaming: layers whose KV lives in host memory",
    "streaming_device_blocks": "Layer streaming: KV cache blocks the device holds",
    "streaming_device_blocks_without": "Layer streaming: blocks the same memory holds without streaming",
    "streaming_host_bytes": "Layer streaming: host bytes reserved for the streamed layers' homes, all workers",
    "streaming_decode_step_bytes": "Layer streaming: host-to-device bytes of a full-context decode step, all workers",
}

RATIO_GAUGES = frozenset({"store_hit_ratio"})  # the others are whole numbers

CONFIG_INFO = "config_info"
CONFIG_INFO_HELP = "ActiveKV's configuration (kv_connector_extra_config) in its labels; the value is 1"
CONFIG_INFO_LABELS: tuple[str, ...] = (
    "mode",
    "capacity_bytes",
    "store_threshold",
    "max_bytes_per_request",
    "store_blocks",
    "fence_timeout_ms",
    "store_path_set",
    "streaming",
    "resident_layers",
    "ring_size",
    "homes",
    "async_load_min_tokens",
)


def config_labels(config) -> list[str]:
    """The info metric's label values (CONFIG_INFO_LABELS' order) of an
    ActiveKVConfig. The store path itself is not shown (a label should not
    carry a file system path), only whether one is set; streaming's labels
    are empty with streaming off."""
    s = config.streaming
    return [
        config.mode,
        str(config.capacity_bytes),
        str(config.store_threshold),
        str(config.max_bytes_per_request),
        config.store_blocks,
        str(config.fence_timeout_ms),
        "true" if config.store_path else "false",
        "true" if s is not None else "false",
        str(s.resident_layers) if s is not None else "",
        str(s.ring_size) if s is not None else "",
        s.homes if s is not None else "",
        str(config.async_load_min_tokens),
    ]


def merge_latest(into: dict[str, dict[str, list]], other: dict[str, dict[str, list]]) -> dict:
    """``into``'s gauge entries, each source's replaced by ``other``'s where as
    recent or newer (seq). New dicts: neither argument changes."""
    out = {name: dict(per) for name, per in into.items()}
    for name, per in other.items():
        mine = out.setdefault(name, {})
        for source, entry in per.items():
            if source not in mine or entry[0] >= mine[source][0]:
                mine[source] = entry
    return out


def sum_over_sources(per: dict[str, list]) -> int | float:
    return sum(entry[1] for entry in per.values())


class Telemetry:
    """A side's counters and gauges between two takes (the engine's
    telemetry.h), reported as ``source``."""

    def __init__(self, source: str):
        self.source = source
        self.data: dict[str, int] = {name: 0 for name in COUNTERS}  # the counts since the last take
        self._gauges: dict[str, int | float] = {}  # the values set last
        self._reported: dict[str, int | float] = {}  # what the last take reported
        self._takes = 0

    def add(self, name: str, value: int) -> None:
        self.data[name] += value

    def set(self, name: str, value: int | float) -> None:
        self._gauges[name] = value

    def take(self) -> ActiveKVStats | None:
        """The counts since the last take, and the gauges whose value changed
        since the last take reported them; None if there is neither."""
        self._takes += 1
        changed = {
            name: v for name, v in self._gauges.items() if name not in self._reported or self._reported[name] != v
        }
        self._reported = dict(self._gauges)
        counts, self.data = self.data, {name: 0 for name in COUNTERS}
        if not changed and not any(counts.values()):
            return None
        gauges = {name: {self.source: [self._takes, changed[name]]} for name in GAUGES if name in changed}
        return ActiveKVStats(data={**counts, "gauges": gauges})


@dataclasses.dataclass
class ActiveKVStats(KVConnectorStats):
    def __post_init__(self) -> None:
        for name in COUNTERS:
            self.data.setdefault(name, 0)
        self.data.setdefault("gauges", {})

    def reset(self) -> None:
        for name in COUNTERS:
            self.data[name] = 0
        self.data["gauges"] = {}

    def aggregate(self, other: KVConnectorStats) -> ActiveKVStats:
        for name in COUNTERS:
            self.data[name] += other.data.get(name, 0)
        self.data["gauges"] = merge_latest(self.data.get("gauges") or {}, other.data.get("gauges") or {})
        return self

    def reduce(self) -> dict[str, int | float]:
        """The counters' sums, and each gauge reported in the interval: the
        sum over its sources of their latest values."""
        out = {name: self.data[name] for name in COUNTERS}
        gauges = self.data.get("gauges") or {}
        out.update({name: sum_over_sources(gauges[name]) for name in GAUGES if name in gauges})
        return out

    def is_empty(self) -> bool:
        return not any(self.data[name] for name in COUNTERS) and not any((self.data.get("gauges") or {}).values())


class ActiveKVPromMetrics(KVConnectorPromMetrics):
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        from .config import ActiveKVConfig

        def children(metric):
            return {idx: metric.labels(*values) for idx, values in per_engine_labelvalues.items()}

        self._counters = {
            name: children(self._counter_cls(name=PREFIX + name, documentation=doc, labelnames=labelnames))
            for name, doc in COUNTERS.items()
        }
        self._gauges = {
            name: children(
                self._gauge_cls(
                    name=PREFIX + name, documentation=doc, multiprocess_mode="mostrecent", labelnames=labelnames
                )
            )
            for name, doc in GAUGES.items()
        }
        # The configuration: one gauge set to 1 per engine (vLLM's own
        # cache_config_info does the same; Prometheus's Info has no
        # multiprocess mode).
        info = self._gauge_cls(
            name=PREFIX + CONFIG_INFO,
            documentation=CONFIG_INFO_HELP,
            multiprocess_mode="mostrecent",
            labelnames=[*labelnames, *CONFIG_INFO_LABELS],
        )
        config = ActiveKVConfig.from_extra_config(vllm_config.kv_transfer_config.kv_connector_extra_config)
        for values in per_engine_labelvalues.values():
            info.labels(*values, *config_labels(config)).set(1)
        self._latest: dict[Any, dict[str, dict[str, list]]] = {}  # engine -> gauge -> source -> [seq, value]

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, per_engine in self._counters.items():
            value = transfer_stats_data.get(name, 0)
            if value:
                per_engine[engine_idx].inc(value)
        reported = transfer_stats_data.get("gauges") or {}
        if not reported:
            return
        latest = self._latest[engine_idx] = merge_latest(self._latest.get(engine_idx, {}), reported)
        for name in reported:
            if name in self._gauges:  # a newer engine's gauge: not ours to show
                self._gauges[name][engine_idx].set(sum_over_sources(latest[name]))
