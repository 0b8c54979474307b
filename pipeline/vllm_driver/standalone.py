"""Either connector implementation outside a vLLM engine, with vLLM's own config
classes: for the parity replays and the tests of the bound behaviour."""

from __future__ import annotations

import importlib
import socket
from types import SimpleNamespace
from typing import Any

import torch

IMPLEMENTATIONS = {
    "reference": ("activekv_reference", "ActiveKVReferenceConnector"),
    "native": ("activekv", "ActiveKVHostConnector"),
}


def connector_class(impl: str):
    module, name = IMPLEMENTATIONS[impl]
    return getattr(importlib.import_module(module), name)


def ensure_distributed() -> None:
    """The worker side asks vLLM for its TP rank: a one-process group on loopback."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        ps.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{port}",
        )
        ps.initialize_model_parallel(1, 1)


def vllm_config(
    extra: dict[str, Any],
    connector_name: str,
    model: str = "tiny",
    tp_size: int = 1,
    num_layers: int = 4,
    max_model_len: int = 2304,
):
    """What the connectors read of a VllmConfig: a plain dense model, no
    speculative decoding, no pipeline parallelism."""
    from vllm.config import KVTransferConfig

    return SimpleNamespace(
        kv_transfer_config=KVTransferConfig(
            kv_connector=connector_name, kv_role="kv_both", kv_connector_extra_config=extra
        ),
        model_config=SimpleNamespace(
            model=model,
            use_mla=False,
            max_model_len=max_model_len,
            get_num_layers_by_block_type=lambda parallel_config, block_type="attention": num_layers,
        ),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp_size, pipeline_parallel_size=1),
        speculative_config=None,
    )


def kv_cache_config(
    num_layers: int = 4,
    block_size: int = 32,
    num_kv_heads: int = 2,
    head_size: int = 32,
    dtype: torch.dtype = torch.bfloat16,
    num_blocks: int = 16,
):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size, dtype=dtype)
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(num_layers)]
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=layers, kv_cache_spec=spec)],
    )


def kv_caches(cfg, seed: int = 0) -> dict[str, torch.Tensor]:
    """CPU KV caches shaped like vLLM's CPU backend for `cfg`."""
    group = cfg.kv_cache_groups[0]
    spec = group.kv_cache_spec
    g = torch.Generator().manual_seed(seed)
    shape = (cfg.num_blocks, 2, spec.block_size, spec.num_kv_heads * spec.head_size)
    return {n: torch.randn(shape, generator=g).to(spec.dtype) for n in group.layer_names}


def make_pair(
    impl: str, extra: dict[str, Any], cfg, *, model: str = "tiny", tp_size: int = 1, max_model_len: int = 2304
):
    """(scheduler side, worker side) connectors of `impl`."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    ensure_distributed()
    cls = connector_class(impl)
    config = vllm_config(extra, cls.__name__, model, tp_size, len(cfg.kv_cache_groups[0].layer_names), max_model_len)
    return (cls(config, KVConnectorRole.SCHEDULER, cfg), cls(config, KVConnectorRole.WORKER, cfg))
