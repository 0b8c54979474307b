from __future__ import annotations

import pytest
from activekv_reference.config import GIB, ActiveKVConfig, ConfigError


def test_defaults_when_nothing_is_configured():
    cfg = ActiveKVConfig.from_extra_config(None)
    assert cfg == ActiveKVConfig()
    assert (cfg.mode, cfg.capacity_bytes, cfg.store_threshold) == ("exact", GIB, 1)


def test_every_key_is_read():
    extra = {
        "mode": "compressed",
        "capacity_bytes": 4096,
        "store_threshold": 3,
        "max_bytes_per_request": 10_000,
        "store_blocks": "prompt_and_decode",
        "fence_timeout_ms": 250,
        "store_path": "/dev/shm/activekv-store",
    }
    cfg = ActiveKVConfig.from_extra_config(extra)
    assert {k: getattr(cfg, k) for k in extra} == extra


@pytest.mark.parametrize(
    "extra, fragments",
    [
        ({"capacity": 1}, ["unknown key 'capacity'", "capacity_bytes", "store_threshold"]),
        ({"capacity_bytes": "1G"}, ["'capacity_bytes'", "expected an integer", "str"]),
        ({"capacity_bytes": 1.5}, ["'capacity_bytes'", "expected an integer", "float"]),
        ({"capacity_bytes": True}, ["'capacity_bytes'", "expected an integer", "bool"]),
        ({"capacity_bytes": -1}, ["'capacity_bytes'", "out of range", "positive"]),
        ({"capacity_bytes": 0}, ["'capacity_bytes'", "positive"]),
        ({"store_threshold": 0}, ["'store_threshold'", ">= 1"]),
        ({"max_bytes_per_request": -5}, ["'max_bytes_per_request'", ">= 0"]),
        ({"fence_timeout_ms": 0}, ["'fence_timeout_ms'", "positive number of milliseconds"]),
        ({"mode": "lossy"}, ["'mode'", "'lossy'", "'exact', 'compressed'"]),
        ({"mode": 1}, ["'mode'", "'exact', 'compressed'"]),
        ({"store_blocks": "all"}, ["'store_blocks'", "'prompt', 'prompt_and_decode'"]),
        ({"store_path": 3}, ["['store_path']: expected a file path (a non-empty string), got int 3"]),
        ({"store_path": ""}, ["['store_path']: expected a file path"]),
    ],
)
def test_bad_config_names_the_key_and_what_it_accepts(extra, fragments):
    with pytest.raises(ConfigError) as err:
        ActiveKVConfig.from_extra_config(extra)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_streaming_is_a_table_with_defaults():
    assert ActiveKVConfig.from_extra_config({"streaming": None}).streaming is None
    cfg = ActiveKVConfig.from_extra_config({"streaming": {}})
    assert (cfg.streaming.resident_layers, cfg.streaming.ring_size, cfg.streaming.homes) == (0, 2, "exact")
    cfg = ActiveKVConfig.from_extra_config({"streaming": {"resident_layers": 3, "ring_size": 4, "homes": "compressed"}})
    assert (cfg.streaming.resident_layers, cfg.streaming.ring_size, cfg.streaming.homes) == (3, 4, "compressed")


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            {"streaming": 2},
            "kv_connector_extra_config['streaming']: expected a table "
            "{'resident_layers': R, 'ring_size': K}, got int 2",
        ),
        (
            {"streaming": {"rings": 2}},
            "kv_connector_extra_config['streaming']: unknown key "
            "'rings'; accepted keys: homes, resident_layers, ring_size",
        ),
        (
            {"streaming": {"homes": "int4"}},
            "kv_connector_extra_config['streaming']['homes']: 'int4' "
            "is not accepted; accepted values: 'exact', 'compressed'",
        ),
        (
            {"streaming": {"homes": 1, "ring_size": 1}},
            "kv_connector_extra_config['streaming']['homes']: 1 is not accepted; accepted values: "
            "'exact', 'compressed'",
        ),
        (
            {"streaming": {"ring_size": 2.0}},
            "kv_connector_extra_config['streaming']['ring_size']: expected an integer, got float 2.0",
        ),
        (
            {"streaming": {"ring_size": 1}},
            "kv_connector_extra_config['streaming']['ring_size']: 1 "
            "is out of range; expected an integer >= 2 (staging "
            "buffers on the device)",
        ),
        (
            {"streaming": {"resident_layers": -1}},
            "kv_connector_extra_config['streaming']['resident_layers']: -1 is out of range; "
            "expected an integer >= 0 (layers kept on the device)",
        ),
        (
            {"streaming": 2, "mode": "fast"},
            "kv_connector_extra_config['mode']: 'fast' is not accepted; accepted values: 'exact', 'compressed'",
        ),
    ],
    ids=[
        "not-a-table",
        "unknown-key",
        "homes-unknown",
        "homes-first",
        "wrong-type",
        "ring-too-small",
        "negative",
        "others-first",
    ],
)
def test_bad_streaming_table_names_the_key(extra, message):
    with pytest.raises(ConfigError) as err:
        ActiveKVConfig.from_extra_config(extra)
    assert str(err.value) == message


def test_async_loads_are_off_unless_asked_and_refused_with_streaming():
    assert ActiveKVConfig.from_extra_config({}).async_load_min_tokens == 0
    assert ActiveKVConfig.from_extra_config({"async_load_min_tokens": 64}).async_load_min_tokens == 64
    with pytest.raises(ConfigError, match=r"\['async_load_min_tokens'\]: -1 is out of range; expected an integer >= 0"):
        ActiveKVConfig.from_extra_config({"async_load_min_tokens": -1})
    with pytest.raises(ConfigError, match=r"\['async_load_min_tokens'\]: expected an integer, got bool True"):
        ActiveKVConfig.from_extra_config({"async_load_min_tokens": True})
    with pytest.raises(ConfigError, match="64 asks for asynchronous loads, but layer streaming lands loads"):
        ActiveKVConfig.from_extra_config({"async_load_min_tokens": 64, "streaming": {"resident_layers": 1}})
