"""The vLLM-facing connector: a KVConnectorBase_V1 that hands each call to the
scheduler side or the worker side, by role. No logic of its own lives here."""

from __future__ import annotations

import importlib
import importlib.util
import logging
from typing import TYPE_CHECKING, Any

import torch
import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.v1.core.sched.output import SchedulerOutput

from .config import ActiveKVConfig, ConfigError, usable_host_memory
from .identity import ModelIdentity
from .layout import KVLayout
from .metadata import ActiveKVMetadata
from .scheduler import SchedulerSide
from .stats import ActiveKVPromMetrics, ActiveKVStats
from .streaming import StartupReport, StreamingGeometry, check_streamable
from .worker import WorkerSide

# Under vLLM's logger: its handlers print it, as they do vLLM's own start-up lines.
logger = logging.getLogger("vllm.activekv_reference")

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig


def layer_hooks_run(forward_context) -> bool:
    """Whether vLLM calls wait_for_layer_load and save_kv_layer this step.

    A full CUDA graph replays the whole model with no Python between layers:
    vLLM 0.26.0's GPU runner starts its loads with no attention metadata bound
    for it, and the older runner marks the forward FULL. A step without a
    forward has no metadata either. None is a caller that makes the per-layer
    calls itself (the parity replay, the tests)."""
    if forward_context is None:
        return True
    if getattr(forward_context, "attn_metadata", None) is None:
        return False
    mode = getattr(forward_context, "cudagraph_runtime_mode", None)
    return getattr(mode, "name", None) != "FULL"


def model_identity(vllm_config: VllmConfig, layout: KVLayout) -> ModelIdentity:
    return ModelIdentity(
        model=str(vllm_config.model_config.model),
        dtype=str(layout.dtype).removeprefix("torch."),
        num_layers=len(layout.layer_names),
        num_kv_heads=layout.num_kv_heads,
        head_size=layout.head_size,
        block_size=layout.block_size,
        tp_size=vllm_config.parallel_config.tensor_parallel_size,
    )


def check_vllm_settings(vllm_config: VllmConfig, config: ActiveKVConfig) -> None:
    """vLLM 0.34's extensible KV cache (on by default on CUDA) commits the
    device memory vLLM measured free after warm-up; with gpu_memory_utilization
    unset it takes all of it, and the loads stage through device buffers of
    their own. Breakable CUDA graphs capture the KV cache update op with the
    early wait streaming needs. Asynchronous loads before vLLM 0.32 (no
    SchedulerOutput.has_sync_kv_loads) are unverified: vLLM 0.26's offline LLM
    drops the statistics of a step without request outputs, where a parked
    request's hit is counted, and that stopped their GPU test before it
    compared the tokens. Refused, naming the setting to use."""
    cache = getattr(vllm_config, "cache_config", None)
    if (
        getattr(cache, "enable_extensible_kv_cache", None) is True
        and getattr(cache, "gpu_memory_utilization", None) is None
    ):
        raise ConfigError(
            "ActiveKV stages its loads through device buffers that vLLM's extensible KV cache (on by "
            "default on CUDA since vLLM 0.34) leaves no room for when gpu_memory_utilization is unset "
            "(it then takes 1.0 of the device): set --gpu-memory-utilization, e.g. 0.9, or start vLLM "
            "with --no-enable-extensible-kv-cache"
        )
    if config.async_load_min_tokens > 0 and "has_sync_kv_loads" not in getattr(
        SchedulerOutput, "__dataclass_fields__", {}
    ):
        raise ConfigError(
            f"kv_connector_extra_config['async_load_min_tokens']={config.async_load_min_tokens} asks for "
            f"asynchronous loads, which ActiveKV has verified on vLLM 0.32 and later; on this vLLM "
            f"{vllm.__version__} they are unverified, so refused: leave "
            "async_load_min_tokens at 0 (every hit loads inside its step)"
        )
    if config.streaming is None:
        return
    compilation = getattr(vllm_config, "compilation_config", None)
    eager = getattr(getattr(vllm_config, "model_config", None), "enforce_eager", False) is True
    if not eager and getattr(compilation, "use_breakable_cudagraph", None) is True:
        raise ConfigError(
            "ActiveKV layer streaming needs each layer's KV cache update to run outside CUDA graphs, "
            "which vLLM's breakable CUDA graphs capture: start vLLM with VLLM_USE_BREAKABLE_CUDAGRAPH=0 "
            "in its environment (or --enforce-eager)"
        )


class ActiveKVReferenceConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.config = ActiveKVConfig.from_extra_config(self._kv_transfer_config.kv_connector_extra_config)
        check_vllm_settings(vllm_config, self.config)
        if self.config.store_path is not None:
            raise ConfigError(
                "kv_connector_extra_config['store_path']: the reference engine keeps its host store "
                "in process memory; a store file is the native engine's (ActiveKVHostConnector)"
            )
        layout = KVLayout.from_kv_cache_config(kv_cache_config)
        slot_bytes = layout.slot_bytes(self.config.mode)
        host = usable_host_memory()
        num_slots = self.config.store_slots(slot_bytes, host)
        geometry = None
        if self.config.streaming is not None:
            check_streamable(vllm_config, kv_cache_config.kv_cache_groups)
            geometry = StreamingGeometry.plan(self.config.streaming, layout.layer_names)
            report = StartupReport.of(
                geometry,
                kv_cache_config.num_blocks,
                layout.block_size,
                layout.layer_bytes(geometry.homes),
                vllm_config.model_config.max_model_len,
            )
            # The homes come on top of the host store, in every worker.
            if self.config.capacity_bytes + report.host_bytes > host.bytes:
                raise ConfigError(
                    f"kv_connector_extra_config['capacity_bytes']={self.config.capacity_bytes} "
                    f"plus the streamed layers' homes ({report.host_bytes} bytes for "
                    f"{kv_cache_config.num_blocks} blocks) exceed {host.what} "
                    f"({host.bytes} bytes); lower capacity_bytes, raise "
                    f"kv_connector_extra_config['streaming']['resident_layers'], or give vLLM "
                    f"fewer KV cache blocks (gpu_memory_utilization, num_gpu_blocks_override)"
                )
            if role == KVConnectorRole.SCHEDULER:
                logger.info("%s", report.line())
        identity = model_identity(vllm_config, layout)
        self.scheduler_side: SchedulerSide | None = None
        self.worker_side: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler_side = SchedulerSide(
                self.config,
                identity.digest(),
                layout.block_size,
                slot_bytes,
                num_slots,
                identity.tp_size,
                num_blocks=kv_cache_config.num_blocks if geometry is not None else None,
            )
            if geometry is not None:
                self.scheduler_side.report_streaming(report)
        else:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            self.worker_side = WorkerSide(self.config, layout, num_slots, get_tensor_model_parallel_rank(), geometry)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a dropped save is only a future miss

    @classmethod
    def get_kv_cache_regions(cls, vllm_config, kv_cache_groups) -> list[list[str]] | None:
        """Layer streaming: the resident layers' regions, then the ring's."""
        config = ActiveKVConfig.from_extra_config(vllm_config.kv_transfer_config.kv_connector_extra_config)
        if config.streaming is None:
            return None
        check_streamable(vllm_config, kv_cache_groups)
        return StreamingGeometry.plan(config.streaming, kv_cache_groups[0].layer_names).regions()

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Layer streaming stages and writes back each layer between the graph
        pieces; loads and saves of the store also run at a step's edges, so
        full CUDA graphs lose them nothing."""
        try:
            return ActiveKVConfig.from_extra_config(extra_config).streaming is not None
        except ValueError:  # refused by the constructor, with its message
            return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config) -> str | None:
        """Streaming wants each block one contiguous row of a layer's view."""
        try:
            config = ActiveKVConfig.from_extra_config(vllm_config.kv_transfer_config.kv_connector_extra_config)
        except ValueError:  # refused by the constructor, with its message
            return None
        check_vllm_settings(vllm_config, config)
        return "HND" if config.streaming is not None else None

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config) -> bool:
        """Sleep mode (vLLM 0.33+) remaps the device KV cache under the worker's
        views and copies in flight: vLLM refuses it, naming the connector."""
        return False

    def loads_before_kv_cache_update(self) -> bool:
        return self.worker_side is not None and self.worker_side.streaming is not None

    # -- worker ---------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.worker_side.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata) -> None:
        if self.worker_side is not None and isinstance(connector_metadata, ActiveKVMetadata):
            self.worker_side.check_plan(connector_metadata)
        super().bind_connector_metadata(connector_metadata)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        self.worker_side.start_load_kv(self._meta(), layer_hooks_run(forward_context))

    def wait_for_layer_load(self, layer_name: str) -> None:
        self.worker_side.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs: Any) -> None:
        self.worker_side.save_kv_layer(layer_name, kv_layer, self._meta())

    def wait_for_save(self) -> None:
        meta = self._connector_metadata
        self.worker_side.wait_for_save(meta if isinstance(meta, ActiveKVMetadata) else None)

    def get_finished(self, finished_req_ids: set[str]):
        return self.worker_side.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker_side.take_load_errors()

    def build_connector_worker_meta(self):
        return self.worker_side.take_worker_meta()

    def get_kv_connector_stats(self):
        side = self.worker_side or self.scheduler_side
        return side.take_stats()

    def _meta(self) -> ActiveKVMetadata:
        meta = self._get_connector_metadata()
        if not isinstance(meta, ActiveKVMetadata):
            raise TypeError(f"ActiveKV got connector metadata of type {type(meta).__name__}")
        return meta

    # -- scheduler ------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return self.scheduler_side.get_num_new_matched_tokens(request, num_computed_tokens)

    def may_load_async(self, request) -> bool:
        # vLLM 0.34, with --max-num-inflight-kv-loads: such a request waits in
        # a queue of its own and may start loading while the batch is full.
        return self.scheduler_side.may_load_async(request)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        self.scheduler_side.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> ActiveKVMetadata:
        meta = self.scheduler_side.build_connector_meta(scheduler_output)
        # vLLM 0.34 starts the loads before the forward only on a step marked
        # so (else after it): a step that loads or streams must start first.
        if hasattr(scheduler_output, "has_sync_kv_loads") and (
            meta.loads or meta.stage_blocks or meta.writeback_blocks
        ):
            scheduler_output.has_sync_kv_loads = True
        return meta

    def update_connector_output(self, connector_output) -> None:
        self.scheduler_side.update_connector_output(connector_output)

    def request_finished(self, request, block_ids):
        return self.scheduler_side.request_finished(request, block_ids)

    def has_pending_push_work(self) -> bool:
        return self.scheduler_side is not None and self.scheduler_side.has_pending_work()

    # -- telemetry ------------------------------------------------------------
    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        return ActiveKVStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return ActiveKVPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)


# vLLM 0.32.0 labels the prefix-cache hits a connector serves; 0.26.0 has no label.
if importlib.util.find_spec("vllm.v1.metrics.cache_hit_source") is not None:
    ActiveKVReferenceConnector._cache_hit_source = importlib.import_module(
        "vllm.v1.metrics.cache_hit_source"
    ).CacheHitSource.HOST
