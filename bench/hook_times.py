"""Where a vLLM step's time goes: wall time spent inside named methods.

The CPU streaming benchmark's engine step tells how long a step took, and
ActiveKV's stream_us how much of it was copying; neither says whether the
rest is the connector's bookkeeping or vLLM's own model. HookClock wraps
methods of classes (the connector's hooks, the model runner's forward, the
attention backend's, the scheduler's schedule) with a timer for as long as
it is entered, in this process only: the benchmark's LLMs run their engine
core in-process. It also times Python's garbage collector by generation: a
collection lands inside whatever method allocated last, so time that grows
in code the engine never runs may be the collector's.
"""

from __future__ import annotations

import functools
import gc
import time
from typing import Any

GC_LABELS = tuple(f"python: gc, generation {g}" for g in range(3))

# The connector's per-step hooks, worker side then scheduler side (vLLM's
# KVConnectorBase_V1); a class lacking one is left alone.
CONNECTOR_HOOKS = (
    "start_load_kv",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_save",
    "bind_connector_metadata",
    "clear_connector_metadata",
    "get_finished",
    "build_connector_meta",
    "update_connector_output",
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "request_finished",
)


class HookClock:
    """Accumulated seconds and calls per label while entered; the methods
    are restored on exit."""

    def __init__(self, targets: list[tuple[type, str, str]]):
        self.targets = targets  # (class, method name, label)
        labels = [label for _, _, label in targets] + list(GC_LABELS)
        self.seconds: dict[str, float] = {label: 0.0 for label in labels}
        self.calls: dict[str, int] = {label: 0 for label in labels}
        self._saved: list[tuple[type, str, Any]] = []
        self._gc_started: float | None = None

    def __enter__(self) -> HookClock:
        # All checked before any is wrapped: a bad target leaves every class as it was.
        for owner, name, _ in self.targets:
            attr = owner.__dict__.get(name)  # a Python function, or the native connector's own
            if not callable(attr) or isinstance(attr, (staticmethod, classmethod)):
                raise ValueError(
                    f"{owner.__qualname__}.{name} is not a method of that class itself "
                    "(inherited, renamed in this vLLM, or a static or class method)"
                )
        for owner, name, label in self.targets:
            inner = owner.__dict__[name]  # the class's own attribute, restored as it was
            self._saved.append((owner, name, inner))
            setattr(owner, name, self._timed(inner, label))
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, inner in reversed(self._saved):
            setattr(owner, name, inner)
        self._saved.clear()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        # A collection's time also counts inside the method it interrupted.
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        if self._gc_started is None:  # entered during a collection: its start went unseen
            return
        label = GC_LABELS[info["generation"]]
        self.seconds[label] += time.perf_counter() - self._gc_started
        self.calls[label] += 1
        self._gc_started = None

    def _timed(self, fn, label: str):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - t0
                self.calls[label] += 1

        return timed

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)


def step_targets(connector_class: type | None) -> list[tuple[type, str, str]]:
    """vLLM's step, model forward, attention and schedule, and the
    connector's hooks that connector_class defines (None: plain vLLM)."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    # The model forward runs inside execute_model, and the connector's layer
    # hooks and the attention (vLLM's CPU backend: the benchmark's) inside the
    # forward; build_connector_meta inside schedule.
    targets = [
        (GPUModelRunner, "execute_model", "vllm: execute_model"),
        (GPUModelRunner, "_model_forward", "vllm: model forward"),
        (CPUAttentionBackendImpl, "forward", "vllm: attention"),
        (CPUAttentionBackendImpl, "do_kv_cache_update", "vllm: KV cache update"),
        (GPUModelRunner, "sample_tokens", "vllm: sample_tokens"),
        (Scheduler, "schedule", "vllm: schedule"),
        (Scheduler, "update_from_output", "vllm: update_from_output"),
    ]
    if connector_class is not None:
        targets += [(connector_class, name, name) for name in CONNECTOR_HOOKS if name in connector_class.__dict__]
    return targets


def connector_class(connector: str | None) -> type | None:
    """The class behind the streaming benchmark's connector name."""
    if connector is None:
        return None
    if connector == "native":
        import activekv

        return activekv.ActiveKVHostConnector
    if connector == "reference":
        from activekv_reference import ActiveKVReferenceConnector

        return ActiveKVReferenceConnector
    raise ValueError(f"no connector class known for {connector!r}")
