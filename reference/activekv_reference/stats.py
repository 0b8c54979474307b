"""Telemetry, through vLLM's connector stats and Prometheus metrics.

Both sides count: the scheduler (lookups, hits, admission, eviction) and each
worker (bytes moved, blocks written and read, time spent). vLLM sums the
worker and scheduler stats each step; the Prometheus counters are named
``vllm:activekv_<name>_total``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

COUNTERS: dict[str, str] = {
    "lookups": "Requests looked up in the host store",
    "hit_blocks": "Blocks served from the host store",
    "hit_tokens": "Tokens served from the host store",
    "stored_blocks": "Blocks whose save completed and became visible",
    "evicted_blocks": "Blocks evicted from the host store (LRU)",
    "rejected_threshold": "Blocks not stored: seen fewer times than store_threshold",
    "rejected_request_cap": "Blocks not stored: request over max_bytes_per_request",
    "rejected_full": "Blocks not stored: every slot pending or pinned",
    "saved_blocks": "Blocks written to host memory by workers",
    "loaded_blocks": "Blocks read from host memory by workers",
    "failed_loads": "Blocks whose load failed (recomputed by vLLM)",
    "bytes_to_host": "Bytes written to the host store",
    "bytes_to_device": "Bytes read from the host store",
    "save_us": "Microseconds spent saving blocks",
    "load_us": "Microseconds spent loading blocks",
    "quarantined_fences": "Transfer fences with an unknown outcome; their staging is never reused",
    "streamed_bytes_to_device": "Layer streaming: bytes staged from the homes into the ring",
    "streamed_bytes_to_host": "Layer streaming: bytes written back from the ring to the homes",
    "stream_us": "Layer streaming: microseconds spent staging and writing back",
    # The streaming geometry (StartupReport), counted once by the scheduler at
    # start-up, so each reads as its value in the stats and in Prometheus.
    "streaming_resident_layers": "Layer streaming: layers whose KV stays on the device",
    "streaming_streamed_layers": "Layer streaming: layers whose KV lives in host memory",
    "streaming_ring_size": "Layer streaming: staging buffers on the device",
    "streaming_device_blocks": "Layer streaming: KV cache blocks the device holds",
    "streaming_device_blocks_without": "Layer streaming: blocks the same memory holds without streaming",
    "streaming_host_bytes": "Layer streaming: host bytes reserved for the streamed layers, per worker",
    "streaming_decode_step_bytes": "Layer streaming: host-to-device bytes of a full-context decode step, per worker",
}


@dataclasses.dataclass
class ActiveKVStats(KVConnectorStats):
    def __post_init__(self) -> None:
        for name in COUNTERS:
            self.data.setdefault(name, 0)

    def add(self, name: str, value: float) -> None:
        self.data[name] += value

    def reset(self) -> None:
        for name in COUNTERS:
            self.data[name] = 0

    def aggregate(self, other: KVConnectorStats) -> ActiveKVStats:
        for name in COUNTERS:
            self.data[name] += other.data.get(name, 0)
        return self

    def reduce(self) -> dict[str, int | float]:
        return {name: self.data[name] for name in COUNTERS}

    def is_empty(self) -> bool:
        return not any(self.data[name] for name in COUNTERS)

    def take(self) -> ActiveKVStats | None:
        """The counts since the last take (None if nothing happened)."""
        if self.is_empty():
            return None
        snapshot = ActiveKVStats(data=dict(self.data))
        self.reset()
        return snapshot


class ActiveKVPromMetrics(KVConnectorPromMetrics):
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {}
        for name, doc in COUNTERS.items():
            counter = self._counter_cls(
                name=f"vllm:activekv_{name}", documentation=doc, labelnames=labelnames
            )
            self._counters[name] = {
                idx: counter.labels(*values) for idx, values in per_engine_labelvalues.items()
            }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, per_engine in self._counters.items():
            value = transfer_stats_data.get(name, 0)
            if value:
                per_engine[engine_idx].inc(value)
