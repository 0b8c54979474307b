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

    def store_slots(self, slot_bytes: int, host: HostMemory) -> int:
        """The host store's size in blocks of ``slot_bytes`` (one block over all
        layers in this mode); ConfigError naming capacity_bytes when that
        is no block, or when capacity_bytes is more than ``host`` (naming it)."""
        where = f"kv_connector_extra_config['capacity_bytes']={self.capacity_bytes}"
        slots = self.capacity_bytes // slot_bytes
        if slots == 0:
            raise ConfigError(f"{where} holds no block; one block takes {slot_bytes} bytes in {self.mode} mode")
        if self.capacity_bytes > host.bytes:
            raise ConfigError(f"{where} exceeds {host.what} ({host.bytes} bytes); ask for less")
        return slots


def physical_memory_bytes() -> int:
    """This host's physical memory in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclasses.dataclass(frozen=True)
class HostMemory:
    """The memory a host store may take, and what that figure is for an error.

    The host's physical memory, or less where this process's cgroup caps it (a
    container's --memory, a systemd unit's MemoryMax): the kernel does not
    refuse an allocation past a cgroup's limit, it kills the process
    mid-serving, so start-up checks capacity_bytes against the smaller."""

    bytes: int
    what: str = "this host's memory"


def cgroup_memory_limit(
    proc_cgroup: str = "/proc/self/cgroup", cgroup_root: str = "/sys/fs/cgroup"
) -> HostMemory | None:
    """The smallest memory limit on the process's cgroup and its ancestors
    (cgroup v2 memory.max, v1 memory/.../memory.limit_in_bytes), naming the
    file that set it; None where none is set or none can be read."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:  # ID:CONTROLLERS:PATH
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "":
            found += _limits_up_from(cgroup_root, path, "memory.max")
        elif "memory" in controllers.split(","):
            found += _limits_up_from(f"{cgroup_root}/memory", path, "memory.limit_in_bytes")
    if not found:
        return None
    return min(found, key=lambda limit: limit.bytes)


def _limits_up_from(mount: str, path: str, name: str) -> list[HostMemory]:
    out = []
    while True:
        file = f"{mount}{'' if path == '/' else path}/{name}"
        if (limit := _read_limit(file)) is not None:
            out.append(HostMemory(limit, f"the memory limit of this process's cgroup, {file}"))
        if path == "/":
            return out
        path = path.rsplit("/", 1)[0] or "/"


def _read_limit(file: str) -> int | None:
    """A limit file's number; None for "max" (v2), v1's "no limit" (a page
    count near 2**63), a missing file or anything else."""
    try:
        with open(file) as f:
            text = f.read().split()
    except OSError:
        return None
    if len(text) != 1 or not text[0].isdigit():
        return None
    value = int(text[0])
    return value if 0 < value < 1 << 62 else None


def usable_host_memory(physical_bytes: int | None = None, cgroup_limit: HostMemory | None = None) -> HostMemory:
    """The smaller of the physical memory and the cgroup limit (both read
    from this host where not given)."""
    if physical_bytes is None:
        physical_bytes, cgroup_limit = physical_memory_bytes(), cgroup_memory_limit()
    if cgroup_limit is not None and cgroup_limit.bytes < physical_bytes:
        return cgroup_limit
    return HostMemory(physical_bytes)


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
