"""A KV connector that does nothing: what vLLM's connector path costs a step
by itself, beside `plain` (no connector) and the tiers that do work.

Loaded by `vllm serve` from this checkout (`kv_connector_module_path`), as
the served benchmark's `null-connector` engine; never shipped.
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata


class NullMetadata(KVConnectorMetadata):
    pass


class NullConnector(KVConnectorBase_V1):
    def start_load_kv(self, forward_context, **kwargs) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        pass

    def wait_for_save(self) -> None:
        pass

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output) -> NullMetadata:
        return NullMetadata()

    def request_finished_all_groups(self, request, block_ids) -> tuple[bool, None]:
        return False, None
