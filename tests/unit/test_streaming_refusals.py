"""Layer streaming's start-up decisions, outside vLLM, in both engines: the
regions vLLM allocates (patch 0002 asks the connector class), and the models
and settings streaming refuses with a message naming the setting."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.vllm_driver import standalone

IMPLS = ["reference", "native"]
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(4)]


def regions(impl: str, extra: dict, *, groups=None, **changes):
    config = standalone.vllm_config(extra, standalone.connector_class(impl).__name__)
    for path, value in changes.items():
        obj, attr = config, path.split("__")
        for name in attr[:-1]:
            obj = getattr(obj, name)
        setattr(obj, attr[-1], value)
    groups = groups if groups is not None else standalone.kv_cache_config().kv_cache_groups
    return standalone.connector_class(impl).get_kv_cache_regions(config, groups)


@pytest.mark.parametrize("impl", IMPLS)
def test_without_streaming_every_layer_keeps_its_own_region(impl):
    assert regions(impl, {}) is None
    assert regions(impl, {"mode": "exact"}) is None


@pytest.mark.parametrize("impl", IMPLS)
def test_resident_layers_come_first_then_the_ring_takes_the_rest_in_turn(impl):
    got = regions(impl, {"streaming": {"resident_layers": 1, "ring_size": 2}})
    # Resident: one region each; streamed layer j (after the resident ones) in buffer j % 2.
    assert got == [[LAYERS[0]], [LAYERS[1], LAYERS[3]], [LAYERS[2]]]
    assert regions(impl, {"streaming": {}}) == [[LAYERS[0], LAYERS[2]], [LAYERS[1], LAYERS[3]]]


def _sliding_groups():
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, SlidingWindowSpec

    spec = SlidingWindowSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.bfloat16, sliding_window=128)
    return [KVCacheGroupSpec(layer_names=LAYERS, kv_cache_spec=spec)]


def _hybrid_groups():
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    full = standalone.kv_cache_config().kv_cache_groups[0]
    return [
        KVCacheGroupSpec(layer_names=LAYERS[:2], kv_cache_spec=full.kv_cache_spec),
        KVCacheGroupSpec(layer_names=LAYERS[2:], kv_cache_spec=_sliding_groups()[0].kv_cache_spec),
    ]


REFUSALS = {
    "mla": ({"model_config__use_mla": True}, "multi-head latent attention"),
    "sliding-window": ({"groups": "sliding"}, "one full-attention group"),
    "hybrid": ({"groups": "hybrid"}, "one full-attention group"),
    "kv-sharing": (
        {"model_config__get_num_layers_by_block_type": lambda pc, kind="attention": 6},
        "layers share KV (6 attention layers, 4 with a KV cache of their own)",
    ),
    "speculative-decoding": ({"speculative_config": SimpleNamespace(method="eagle")}, "speculative decoding"),
    "pipeline-parallel": ({"parallel_config__pipeline_parallel_size": 2}, "pipeline parallelism"),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
def test_what_streaming_cannot_serve_is_refused_naming_the_setting(impl, case):
    changes, fragment = REFUSALS[case]
    changes = dict(changes)
    groups = {"sliding": _sliding_groups, "hybrid": _hybrid_groups}.get(changes.pop("groups", None))
    with pytest.raises(ValueError) as refused:
        regions(impl, {"streaming": {}}, groups=groups() if groups else None, **changes)
    message = str(refused.value)
    assert "kv_connector_extra_config['streaming']" in message
    assert fragment in message


def test_both_engines_refuse_with_the_same_words():
    for case, (changes, _) in REFUSALS.items():
        changes = dict(changes)
        groups = {"sliding": _sliding_groups, "hybrid": _hybrid_groups}.get(changes.pop("groups", None))
        messages = []
        for impl in IMPLS:
            with pytest.raises(ValueError) as refused:
                regions(impl, {"streaming": {}}, groups=groups() if groups else None, **changes)
            messages.append(str(refused.value))
        assert messages[0] == messages[1], case
