"""ActiveKV configuration, read from vLLM's ``kv_connector_extra_config``.

Every key is checked when the connector starts: an unknown key, a value of the
wrong type or out of range, or an unknown mode fails at once with a message
that names the key and what it accepts.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Literal, get_args

Mode = Literal["exact", "compressed"]
StoreScope = Literal["prompt", "prompt_and_decode"]

GIB = 1 << 30


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamingConfig:
    """Layer streaming (streaming.py): the first ``resident_layers`` layers keep
    their KV on the device; the others live in host memory and take turns in
    a ring of ``ring_size`` device buffers, one layer's worth of blocks each.
    ``homes`` is how the host holds the streamed layers: ``exact`` bytes, or
    ``compressed`` (codec.py's int8 + scales: (1 + 4 / head_size) / 2 of the
    bytes and the bus time, 0.52x at head size 128; lossy within the codec's
    bound, re-encoded at each write-back)."""

    resident_layers: int = 0
    ring_size: int = 2
    homes: Mode = "exact"


_STREAMING_RANGES = {
    "resident_layers": (lambda v: v >= 0, "an integer >= 0 (layers kept on the device)"),
    "ring_size": (lambda v: v >= 2, "an integer >= 2 (staging buffers on the device)"),
}


class Error(ValueError):
    """What ActiveKV refuses: a ConfigError or an UnsupportedLayoutError
    (the native module's activekv.Error)."""


class ConfigError(Error):
    """A configuration ActiveKV refuses: a bad ``kv_connector_extra_config``
    (the message names the key) or vLLM settings it cannot serve (it names
    the setting to use). The native module raises activekv.ConfigError."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ActiveKVConfig:
    # exact: KV bytes stored as they are; compressed: int8 with per-token,
    # per-head float32 scales (see codec.py for the error bound).
    mode: Mode = "exact"
    # Host store size in bytes (per worker). Blocks beyond it are evicted by LRU.
    capacity_bytes: int = 1 * GIB
    # A block is admitted to the store on its N-th sighting (1 = first time seen).
    store_threshold: int = 1
    # At most this many host bytes are written for one request; 0 = no cap.
    max_bytes_per_request: int = 0
    # Which full blocks are saved: the prompt's only, or decode blocks too.
    store_blocks: StoreScope = "prompt"
    # How long a worker waits for a save's copies before quarantining their
    # slots (the native engine's fences; the reference's copies are immediate).
    fence_timeout_ms: int = 30_000
    # Layer streaming: a table {"resident_layers": R, "ring_size": K}; absent
    # or None: every layer's KV stays on the device (no streaming).
    streaming: StreamingConfig | None = None
    # A hit of at least this many tokens loads asynchronously: vLLM parks the
    # request (WAITING_FOR_REMOTE_KVS) while its blocks cross and runs the
    # other requests' steps meanwhile. 0: every load lands inside the step
    # that computes the request. Refused with streaming.
    async_load_min_tokens: int = 0
    # A file that holds the host store across restarts (the native engine's
    # store file; this reference keeps its store in process memory and
    # refuses it at start-up). None: in process memory.
    store_path: str | None = None

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> ActiveKVConfig:
        """Validate ``extra`` and build the config; raises ConfigError."""
        extra = dict(extra or {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(extra) - set(fields))
        if unknown:
            raise ConfigError(
                f"kv_connector_extra_config: unknown key {unknown[0]!r}; accepted keys: {', '.join(sorted(fields))}"
            )
        for name in sorted(extra):  # sorted: the same first error in every engine
            _check_value(name, fields[name].type, extra[name])
        streaming = extra.pop("streaming", None)
        if streaming is not None:
            extra["streaming"] = _streaming(streaming)
        config = cls(**extra)
        if config.streaming is not None and config.async_load_min_tokens > 0:
            raise ConfigError(
                f"kv_connector_extra_config['async_load_min_tokens']: {config.async_load_min_tokens} asks for "
                "asynchronous loads, but layer streaming lands loads inside the forward; leave "
                "async_load_min_tokens at 0 with streaming"
            )
        return config

    def store_slots(self, slot_bytes: int, host_memory_bytes: int) -> int:
        """The host store's size in blocks of ``slot_bytes`` (one block over all
        layers in this mode); ConfigError naming capacity_bytes when that
        is no block, or when capacity_bytes is more than ``host_memory_bytes``."""
        where = f"kv_connector_extra_config['capacity_bytes']={self.capacity_bytes}"
        slots = self.capacity_bytes // slot_bytes
        if slots == 0:
            raise ConfigError(f"{where} holds no block; one block takes {slot_bytes} bytes in {self.mode} mode")
        if self.capacity_bytes > host_memory_bytes:
            raise ConfigError(f"{where} exceeds this host's memory ({host_memory_bytes} bytes); ask for less")
        return slots


def physical_memory_bytes() -> int:
    """This host's physical memory in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _streaming(table: Any) -> StreamingConfig:
    where = "kv_connector_extra_config['streaming']"
    if not isinstance(table, Mapping):
        raise ConfigError(
            f"{where}: expected a table {{'resident_layers': R, 'ring_size': K}}, got {type(table).__name__} {table!r}"
        )
    accepted_keys = sorted([*_STREAMING_RANGES, "homes"])
    unknown = sorted(set(table) - set(accepted_keys))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; accepted keys: {', '.join(accepted_keys)}")
    for name in sorted(table):
        value = table[name]
        if name == "homes":
            accepted = get_args(Mode)
            if value not in accepted:
                raise ConfigError(
                    f"{where}['homes']: {value!r} is not accepted; accepted values: "
                    f"{', '.join(repr(a) for a in accepted)}"
                )
            continue
        check, accepts = _STREAMING_RANGES[name]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{where}[{name!r}]: expected an integer, got {type(value).__name__} {value!r}")
        if not check(value):
            raise ConfigError(f"{where}[{name!r}]: {value!r} is out of range; expected {accepts}")
    return StreamingConfig(**table)


# Checks for each key beyond its type: (predicate, what the key accepts).
_RANGES = {
    "capacity_bytes": (lambda v: v > 0, "a positive number of bytes"),
    "store_threshold": (lambda v: v >= 1, "an integer >= 1"),
    "max_bytes_per_request": (lambda v: v >= 0, "an integer >= 0 (0 = no cap)"),
    "fence_timeout_ms": (lambda v: v >= 1, "a positive number of milliseconds"),
    "async_load_min_tokens": (lambda v: v >= 0, "an integer >= 0 (0 = every load inside its step)"),
}
_LITERALS = {"Mode": Mode, "StoreScope": StoreScope}


def _check_value(name: str, annotation: str, value: Any) -> None:
    where = f"kv_connector_extra_config[{name!r}]"
    if annotation == "StreamingConfig | None":
        return  # a table: checked key by key in _streaming
    if annotation == "str | None":
        if not isinstance(value, str) or not value:
            raise ConfigError(
                f"{where}: expected a file path (a non-empty string), got {type(value).__name__} {value!r}"
            )
        return
    if annotation in _LITERALS:
        accepted = get_args(_LITERALS[annotation])
        if value not in accepted:
            raise ConfigError(
                f"{where}: {value!r} is not accepted; accepted values: {', '.join(repr(a) for a in accepted)}"
            )
        return
    # bool is an int subclass in Python; a flag is never a byte count.
    if annotation == "int" and (not isinstance(value, int) or isinstance(value, bool)):
        raise ConfigError(f"{where}: expected an integer, got {type(value).__name__} {value!r}")
    check, accepts = _RANGES.get(name, (None, ""))
    if check is not None and not check(value):
        raise ConfigError(f"{where}: {value!r} is out of range; expected {accepts}")
