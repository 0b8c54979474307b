"""The KV cache geometry ActiveKV works with, read from vLLM's KV cache config."""

from __future__ import annotations

import dataclasses

import torch

from .codec import layer_bytes
from .config import Error, Mode


class UnsupportedLayoutError(Error):
    """A KV cache ActiveKV cannot serve (the native module's
    activekv.UnsupportedLayoutError)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class KVLayout:
    layer_names: tuple[str, ...]
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    @classmethod
    def from_kv_cache_config(cls, kv_cache_config) -> KVLayout:
        # Imported here: the spec classes are only needed to read vLLM's config.
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        groups = kv_cache_config.kv_cache_groups
        if len(groups) != 1 or type(groups[0].kv_cache_spec) is not FullAttentionSpec:
            kinds = [type(g.kv_cache_spec).__name__ for g in groups]
            raise UnsupportedLayoutError(
                f"ActiveKV cannot serve KV cache groups {kinds}: it needs one full-attention "
                "group (no sliding-window or hybrid groups)"
            )
        spec = groups[0].kv_cache_spec
        if spec.head_size_v != spec.head_size:
            raise UnsupportedLayoutError("ActiveKV needs K and V heads of the same size")
        return cls(
            layer_names=tuple(groups[0].layer_names),
            block_size=spec.block_size,
            num_kv_heads=spec.num_kv_heads,
            head_size=spec.head_size,
            dtype=spec.dtype,
        )

    @property
    def block_numel(self) -> int:
        """KV elements of one block of one layer (K and V)."""
        return 2 * self.block_size * self.num_kv_heads * self.head_size

    def layer_bytes(self, mode: Mode) -> int:
        return layer_bytes(mode, self.block_numel, self.dtype, self.head_size)

    def slot_bytes(self, mode: Mode) -> int:
        """Host bytes of one block over all layers: the unit of the store."""
        return len(self.layer_names) * self.layer_bytes(mode)
