"""The reference connector, recording every call vLLM makes (parity only).

Load it in vLLM with kv_connector="RecordingReferenceConnector",
kv_connector_module_path="pipeline.parity.recorder" and ACTIVEKV_RECORD_DIR set.
"""

from __future__ import annotations

from activekv_reference import ActiveKVReferenceConnector
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from .trace import (
    plain_metadata,
    plain_request,
    plain_scheduler_output,
    plain_worker_meta,
    writer_from_env,
)


class RecordingReferenceConnector(ActiveKVReferenceConnector):
    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        is_scheduler = role == KVConnectorRole.SCHEDULER
        self._trace = writer_from_env("scheduler" if is_scheduler else "worker")
        self._trace.add(
            "init",
            role="scheduler" if is_scheduler else "worker",
            extra_config=dict(self._kv_transfer_config.kv_connector_extra_config),
            model=str(vllm_config.model_config.model),
            tp_size=vllm_config.parallel_config.tensor_parallel_size,
            max_model_len=vllm_config.model_config.max_model_len,
            kv_cache_config=kv_cache_config,
            # Whether vLLM builds a step before the last one's output reached
            # the scheduler (the replay hands outputs over as vLLM did).
            async_scheduling=bool(getattr(vllm_config.scheduler_config, "async_scheduling", False)),
        )

    # -- scheduler --------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self._trace.refresh_segment()  # a scenario's first call of the scheduler
        ret = super().get_num_new_matched_tokens(request, num_computed_tokens)
        self._trace.add(
            "get_num_new_matched_tokens",
            request=plain_request(request),
            num_computed_tokens=num_computed_tokens,
            ret=ret,
        )
        return ret

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        self._trace.add(
            "update_state_after_alloc",
            request=plain_request(request),
            block_ids=list(blocks.get_block_ids()[0]),
            num_external_tokens=num_external_tokens,
        )

    def build_connector_meta(self, scheduler_output):
        self._trace.refresh_segment()
        meta = super().build_connector_meta(scheduler_output)
        running = self.scheduler_side._requests.values()
        self._trace.add(
            "build_connector_meta",
            scheduler_output=plain_scheduler_output(scheduler_output),
            tokens={st.request.request_id: list(st.request.all_token_ids) for st in running},
            ret=plain_metadata(meta),
        )
        return meta

    def update_connector_output(self, connector_output):
        super().update_connector_output(connector_output)
        self._trace.add(
            "update_connector_output", worker_meta=plain_worker_meta(connector_output.kv_connector_worker_meta)
        )

    def request_finished(self, request, block_ids):
        ret = super().request_finished(request, block_ids)
        self._trace.add("request_finished", request_id=request.request_id, ret=ret)
        return ret

    # -- worker -----------------------------------------------------------------
    def register_kv_caches(self, kv_caches):
        super().register_kv_caches(kv_caches)
        # Layers whose KV caches share bytes (layer streaming's ring buffers).
        shared: dict[int, list[str]] = {}
        for n, t in kv_caches.items():
            shared.setdefault(t.data_ptr(), []).append(n)
        self._trace.add(
            "register_kv_caches",
            layers={n: (tuple(t.shape), str(t.dtype)) for n, t in kv_caches.items()},
            regions=list(shared.values()),
        )

    def bind_connector_metadata(self, connector_metadata):
        self._trace.refresh_segment()
        super().bind_connector_metadata(connector_metadata)
        self._trace.add("bind_connector_metadata", meta=plain_metadata(connector_metadata))

    def start_load_kv(self, forward_context, **kwargs):
        super().start_load_kv(forward_context, **kwargs)
        self._trace.add("start_load_kv")

    def wait_for_layer_load(self, layer_name):
        super().wait_for_layer_load(layer_name)
        self._trace.add("wait_for_layer_load", layer=layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        meta = self._get_connector_metadata()
        ids = [op.block_id for op in meta.saves]
        back = list(meta.writeback_blocks) if self.worker_side.streamer is not None else []
        # What the save and the write-back read: the blocks as the forward left them
        # (copies in host memory: a trace replays on any device).
        self._trace.add(
            "save_kv_layer",
            layer=layer_name,
            block_ids=ids,
            blocks=kv_layer[ids].cpu(),
            writeback_ids=back,
            writeback=kv_layer[back].cpu(),
        )
        super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self):
        super().wait_for_save()
        self._trace.add("wait_for_save")

    def get_finished(self, finished_req_ids):
        ret = super().get_finished(finished_req_ids)
        self._trace.add("get_finished", finished=sorted(finished_req_ids), ret=ret)
        return ret

    def get_block_ids_with_load_errors(self):
        ret = super().get_block_ids_with_load_errors()
        self._trace.add("get_block_ids_with_load_errors", ret=sorted(ret))
        return ret

    def build_connector_worker_meta(self):
        ret = super().build_connector_worker_meta()
        self._trace.add("build_connector_worker_meta", ret=plain_worker_meta(ret))
        return ret

    def clear_connector_metadata(self):
        super().clear_connector_metadata()
        self._trace.add("clear_connector_metadata")
