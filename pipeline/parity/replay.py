"""Replay a recorded vLLM session on one connector implementation.

The scheduler events are replayed in their recorded order with the recorded
inputs; after each build_connector_meta the worker step of the same index is
replayed with the metadata *this* implementation produced, the recorded KV
contents written into the blocks each save reads, and the worker's output fed
back to this implementation's scheduler side. Every return value, every
metadata object, the loaded block contents and, at the end of each segment,
the bytes of every block in the host store are collected as observations.

Layer streaming: the KV caches of the layers that shared bytes in the
recording (the ring buffers) share them here too; the blocks each layer's
staging put in the ring are observed, the recorded contents of the blocks the
step wrote are put in the ring before the write-back (what vLLM's forward
wrote), and the streamed layers' homes are observed at the end of each segment.

Full CUDA graph steps (`layer_hooks=False`): the worker is told at
start_load_kv that no per-layer hook runs, as vLLM's forward context tells it
when a step replays a full graph, and it gets no wait_for_layer_load or
save_kv_layer call; the same observations are made at the same points, so
they must equal a replay with the hooks.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import time
from collections import defaultdict, deque
from types import SimpleNamespace
from typing import Any

import torch

from ..vllm_driver.standalone import make_pair
from .trace import plain_metadata, plain_worker_meta

Observation = tuple[str, Any]  # (what, value)


class TraceMismatchError(ValueError):
    """The recording cannot be replayed (another model identity, a broken file)."""


class ReplayError(RuntimeError):
    """An implementation failed while replaying: which one, how, and where."""


@dataclasses.dataclass
class ReplayResult:
    observations: dict[str, list[Observation]]  # per segment
    live_differs: dict[str, int]  # per segment: scheduler returns unlike the live run
    steps: int = 0
    connector_seconds: float = 0.0  # inside connector calls only
    # Steps that move no block: what the connector costs vLLM on every step.
    control_steps: int = 0
    control_seconds: float = 0.0

    def per_step_us(self) -> float:
        return 1e6 * self.connector_seconds / max(self.steps, 1)

    def control_step_us(self) -> float:
        return 1e6 * self.control_seconds / max(self.control_steps, 1)


class _Clock:
    """Accumulates the time spent inside connector calls."""

    def __init__(self):
        self.seconds = 0.0

    def __call__(self, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t0


def streamed_homes(worker) -> dict[str, str]:
    """SHA-256 of each streamed layer's home (every block), for either implementation."""
    if hasattr(worker, "worker_side"):  # reference
        streamer = worker.worker_side.streamer
        if streamer is None:
            return {}
        return {n: _digest(home) for n, home in streamer.homes.items()}
    engine = worker._activekv_worker
    return {n: hashlib.sha256(engine.streamed_home(n)).hexdigest() for n in engine.streamed_layers()}


def store_bytes(worker) -> dict[int, str]:
    """SHA-256 of every sealed slot's bytes, by slot, for either implementation."""
    if hasattr(worker, "worker_side"):  # reference
        arena = worker.worker_side.arena
        return {s: hashlib.sha256(arena.slot_data(s)).hexdigest() for s in arena.sealed_slots()}
    engine = worker._activekv_worker
    return {s: hashlib.sha256(engine.slot_data(s)).hexdigest() for s in engine.sealed_slots()}


class _Blocks:
    def __init__(self, ids):
        self._ids = ids

    def get_block_ids(self):
        return (self._ids,)


def _check_identity(sched_init: dict, worker_init: dict, model_identity: str | None) -> None:
    if model_identity is not None and sched_init["model"] != model_identity:
        raise TraceMismatchError(
            f"recording is of model {sched_init['model']!r}, not {model_identity!r}: record it again for this model"
        )
    if sched_init["extra_config"] != worker_init["extra_config"]:
        raise TraceMismatchError("scheduler and worker traces come from different configurations")


def replay(
    sched_events: list[dict],
    worker_events: list[dict],
    impl: str,
    model_identity: str | None = None,
    layer_hooks: bool = True,
    device: str = "cpu",
) -> ReplayResult:
    """Replays the recording on one fresh pair of connectors of `impl`, the
    KV caches on `device` (the target's: its copies are what is compared)."""
    if not sched_events or sched_events[0]["kind"] != "init":
        raise TraceMismatchError("scheduler trace does not start with its init event")
    if not worker_events or worker_events[0]["kind"] != "init":
        raise TraceMismatchError("worker trace does not start with its init event")
    _check_identity(sched_events[0], worker_events[0], model_identity)
    # Free what earlier replays left (their connectors and arenas) now: freed
    # by a collection inside a timed call, it was charged to this replay's
    # connector (one recording read 0.4x for the native engine that way).
    gc.collect()
    run = _Replay(impl, sched_events[0], worker_events, layer_hooks, device)
    for ev in sched_events[1:]:
        try:
            run.scheduler_event(ev)
        except TraceMismatchError:
            raise
        except Exception as e:
            hooks = "with per-layer hooks" if layer_hooks else "without per-layer hooks (full CUDA graph)"
            raise ReplayError(
                f"replay of the {impl} engine {hooks}, segment {ev['segment']!r}, step {run.step}, "
                f"at {ev['kind']}: {e.__class__.__name__}: {e}"
            ) from e
    return run.result()


class _Replay:
    """One replay's connectors, KV caches and observations."""

    def __init__(self, impl: str, sched_init: dict, worker_events: list[dict], layer_hooks: bool, device: str):
        self.sched, _ = _pair_as_recorded(impl, sched_init)
        _, self.worker = _pair_as_recorded(impl, worker_events[0])
        self.kv = _registered_kv_caches(self.worker, worker_events, device)
        self.steps = _worker_steps(worker_events[1:])
        self.layer_hooks = layer_hooks
        self.obs: dict[str, list[Observation]] = defaultdict(list)
        self.live_differs: dict[str, int] = defaultdict(int)
        self.requests: dict[str, SimpleNamespace] = {}
        self.outputs = _Unreported(lag=1 if sched_init.get("async_scheduling") else 0)
        self.step = 0
        self.segment = ""
        self.clock = _Clock()
        self.control_steps, self.control_seconds = 0, 0.0

    def scheduler_event(self, ev: dict) -> None:
        if ev["segment"] != self.segment:
            self._end_segment()
            self.segment = ev["segment"]
        kind, sched, clock = ev["kind"], self.sched, self.clock
        if kind == "get_num_new_matched_tokens":
            ret = tuple(
                clock(sched.get_num_new_matched_tokens, self._request(ev["request"]), ev["num_computed_tokens"])
            )
            self.obs[self.segment].append(("get_num_new_matched_tokens", ret))
            self.live_differs[self.segment] += ret != tuple(ev["ret"])
        elif kind == "update_state_after_alloc":
            blocks = _Blocks(ev["block_ids"])
            clock(sched.update_state_after_alloc, self._request(ev["request"]), blocks, ev["num_external_tokens"])
        elif kind == "build_connector_meta":
            for rid, tokens in ev["tokens"].items():
                if rid in self.requests:
                    self.requests[rid].all_token_ids = tokens
            self._one_step(ev, self.obs[self.segment])
        elif kind == "update_connector_output":
            for output in self.outputs.at_update(_said(ev["worker_meta"])):
                clock(sched.update_connector_output, output)
        elif kind == "request_finished":
            ret = tuple(clock(sched.request_finished, SimpleNamespace(request_id=ev["request_id"]), []))
            self.obs[self.segment].append(("request_finished", (ev["request_id"], ret)))
            self.live_differs[self.segment] += ret != tuple(ev["ret"])
        elif kind == "register_kv_caches":
            raise TraceMismatchError("register event in the scheduler trace")

    def result(self) -> ReplayResult:
        self._end_segment()
        return ReplayResult(
            dict(self.obs),
            dict(self.live_differs),
            self.step,
            self.clock.seconds,
            self.control_steps,
            self.control_seconds,
        )

    def _one_step(self, ev: dict, seen: list[Observation]) -> None:
        """The scheduler builds the step's plan; the worker runs it."""
        clock = self.clock
        for output in self.outputs.before_build():
            clock(self.sched.update_connector_output, output)
        step_start = clock.seconds
        meta = clock(self.sched.build_connector_meta, scheduler_output_from_plain(ev["scheduler_output"]))
        seen.append(("build_connector_meta", plain_metadata(meta)))
        self.live_differs[self.segment] += plain_metadata(meta) != ev["ret"]
        if self.step >= len(self.steps):
            raise TraceMismatchError(f"worker trace ends before step {self.step}")
        recorded = self.steps[self.step]
        output = _worker_step(self.worker, self.kv, meta, recorded, seen, clock, self.layer_hooks)
        self.outputs.add(output, _live_worker_meta(recorded))
        self.step += 1
        if not (meta.loads or meta.async_loads or meta.saves or meta.stage_blocks or meta.writeback_blocks):
            self.control_steps += 1
            self.control_seconds += clock.seconds - step_start

    def _request(self, plain: dict) -> SimpleNamespace:
        r = self.requests.setdefault(plain["request_id"], SimpleNamespace(**plain))
        r.all_token_ids = plain["all_token_ids"]
        return r

    def _end_segment(self) -> None:
        if self.segment:
            self.obs[self.segment].append(("host store", store_bytes(self.worker)))
            homes = streamed_homes(self.worker)
            if homes:
                self.obs[self.segment].append(("streamed homes", homes))


class _Unreported:
    """The replayed steps' worker outputs that vLLM had not yet handed to the
    scheduler, oldest first, so each reaches it where the recording's did.

    vLLM calls update_connector_output with a step's output, after the step,
    only when the output holds something. In order: synchronous scheduling
    builds step N+1 after it (`lag` 0); asynchronous scheduling (vLLM 0.34's
    default on CUDA) builds step N+1 while step N runs and updates after
    that (`lag` 1). A step whose output came with no update goes in before
    the next build once `lag` younger steps wait, as vLLM moved on without
    it; an update takes the oldest waiting step whose live worker metadata
    is the one the recording updated with (that step, and those before it)."""

    def __init__(self, lag: int):
        self.lag = lag
        self._waiting: deque[tuple[Any, dict | None]] = deque()  # (output or None, live worker meta)

    def add(self, output, live_meta: dict | None) -> None:
        self._waiting.append((output, live_meta))

    def before_build(self) -> list:
        taken = []
        while len(self._waiting) > self.lag:
            taken.append(self._waiting.popleft()[0])
        return [o for o in taken if o is not None]

    def at_update(self, said: dict | None) -> list:
        if not self._waiting:
            return []
        upto = next((i for i, (_, live) in enumerate(self._waiting) if live == said), 0)
        taken = [self._waiting.popleft()[0] for _ in range(upto + 1)]
        return [o for o in taken if o is not None]


def _said(plain: dict | None) -> dict | None:
    """A plain worker metadata, None where it holds nothing."""
    return plain if plain and any(plain.values()) else None


def _live_worker_meta(events: list[dict]) -> dict | None:
    """The worker metadata the recorded step handed vLLM."""
    return next((_said(ev["ret"]) for ev in events if ev["kind"] == "build_connector_worker_meta"), None)


def _pair_as_recorded(impl: str, init: dict):
    """A fresh connector pair of `impl` made as the recording's init event says."""
    return make_pair(
        impl,
        init["extra_config"],
        init["kv_cache_config"],
        model=init["model"],
        tp_size=init["tp_size"],
        max_model_len=init["max_model_len"],
    )


def _registered_kv_caches(worker, worker_events: list[dict], device: str) -> dict:
    """Zeroed KV caches of the recorded shapes on `device`, registered with
    the worker: one tensor per region, so layers that shared bytes in vLLM
    share them here."""
    register = [e for e in worker_events if e["kind"] == "register_kv_caches"]
    if len(register) != 1:
        raise TraceMismatchError("worker trace must register its KV caches exactly once")
    layers = register[0]["layers"]
    kv = {}
    for region in register[0].get("regions", [[n] for n in layers]):
        shape, dtype = layers[region[0]]
        tensor = torch.zeros(shape, dtype=getattr(torch, dtype.removeprefix("torch.")), device=device)
        kv.update((name, tensor) for name in region)
    worker.register_kv_caches(kv)
    return kv


def _worker_steps(events: list[dict]) -> list[list[dict]]:
    """The worker's events grouped by step: each step starts at its bind."""
    steps: list[list[dict]] = []
    for ev in events:
        if ev["kind"] == "bind_connector_metadata":
            steps.append([])
        if steps:
            steps[-1].append(ev)
    return steps


def scheduler_output_from_plain(plain: dict[str, Any]):
    cached = SimpleNamespace(
        req_ids=plain["cached_req_ids"],
        resumed_req_ids=set(plain["resumed"]),
        new_block_ids=[None if b is None else (b,) for b in plain["new_block_ids"]],
        num_computed_tokens=plain["num_computed_tokens"],
    )
    return SimpleNamespace(
        scheduled_new_reqs=[
            SimpleNamespace(req_id=r, block_ids=(b,), num_computed_tokens=n) for r, b, n in plain["new"]
        ],
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=plain["num_scheduled_tokens"],
        finished_req_ids=set(plain["finished_req_ids"]),
    )


def _block_ids(ops) -> list[int]:
    """Device block ids of load or save ops of either implementation's metadata."""
    return [op[1] if isinstance(op, tuple) else op.block_id for op in ops]


def _put_blocks(layer: torch.Tensor, ids: list[int], blocks: torch.Tensor | None) -> None:
    """The recorded blocks (host memory) into the layer's device blocks `ids`:
    one copy, not one a block (each a synchronous copy on a GPU). A block
    named twice gets its last copy, as block by block."""
    if not ids:
        return
    if len(set(ids)) < len(ids):
        for i, b in enumerate(ids):
            layer[b] = blocks[i]
        return
    layer[torch.tensor(ids, device=layer.device)] = blocks.to(layer.device)


def _digest(t: torch.Tensor) -> str:
    # Hashed where the bytes lie (the buffer protocol): a copy less of every observation.
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy()).hexdigest()


def full_graph_forward_context():
    """What vLLM's forward context says of a step that replays a full CUDA graph."""
    from vllm.config import CUDAGraphMode

    return SimpleNamespace(attn_metadata={}, cudagraph_runtime_mode=CUDAGraphMode.FULL)


def settle_device(kv: dict) -> None:
    """Waits, outside the clock, until the accelerator has run everything
    queued. When a copy to the host lands is the device's timing, not a choice
    of the implementation: the reference waits for its saves in
    wait_for_save, the native engine reports each save once its fence has
    signalled, and vLLM hands the scheduler whatever was reported. Idle here,
    both report every save of the step in that step, as the live run's
    reference did, so the replay stays on the recording (a hit the live run
    took is there to pin) and the two report alike. Without this wait, an
    H100 replay of a compressed recording on vLLM 0.34 with no per-layer
    hooks (every save issued at wait_for_save, the codec's kernels before
    the copies) pinned a block its scheduler had not yet seen land."""
    device = next(iter(kv.values())).device
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def _worker_step(worker, kv, meta, events, out: list[Observation], clock: _Clock, layer_hooks: bool = True):
    from vllm.v1.outputs import KVConnectorOutput

    clock(worker.bind_connector_metadata, meta)
    finished_sending = finished_recving = None
    output = KVConnectorOutput()
    load_ids = _block_ids(meta.loads)
    async_ids = [b for a in meta.async_loads for b in _block_ids(a[1] if isinstance(a, tuple) else a.loads)]
    stage_ids = list(meta.stage_blocks)
    staged: set[str] = set()
    # As vLLM with the patch series does: the attention wrapper asks
    # has_layer_work once per layer and, when it is False, makes neither
    # per-layer call. A connector without it (the reference) gets both calls,
    # as the patch's default does.
    ask = getattr(worker, "has_layer_work", None)
    layer_work: dict[str, bool] = {}

    def works(layer: str) -> bool:
        if not layer_hooks:
            return False
        if layer not in layer_work:
            layer_work[layer] = ask is None or bool(clock(ask))
        return layer_work[layer]

    for ev in events:
        kind = ev["kind"]
        if kind == "start_load_kv":
            clock(worker.start_load_kv, None if layer_hooks else full_graph_forward_context())
        elif kind == "wait_for_layer_load":
            if works(ev["layer"]):
                clock(worker.wait_for_layer_load, ev["layer"])
            if stage_ids and ev["layer"] not in staged:  # the first wait stages
                staged.add(ev["layer"])
                out.append(("staged", (ev["layer"], _digest(kv[ev["layer"]][stage_ids]))))
            if load_ids:
                out.append(("loaded", (ev["layer"], _digest(kv[ev["layer"]][load_ids]))))
        elif kind == "save_kv_layer":
            layer = kv[ev["layer"]]
            ids = _block_ids(meta.saves)
            if ids != ev["block_ids"]:
                # This implementation planned other saves than the recording:
                # give it the recorded contents where they exist.
                out.append(("save plan differs from the recording", (ids, ev["block_ids"])))
            _put_blocks(layer, ev["block_ids"], ev["blocks"])
            back = list(meta.writeback_blocks)
            if back != ev.get("writeback_ids", []):
                out.append(("write-back plan differs from the recording", (back, ev.get("writeback_ids"))))
            _put_blocks(layer, ev.get("writeback_ids", []), ev.get("writeback"))
            if works(ev["layer"]):
                clock(worker.save_kv_layer, ev["layer"], layer, None)
        elif kind == "wait_for_save":
            clock(worker.wait_for_save)
        elif kind == "get_finished":
            # Asynchronous loads land when the device gets to them: idle here,
            # every one issued is named in its step, as on the CPU.
            settle_device(kv)
            sending, recving = clock(worker.get_finished, set(ev["finished"]))
            finished_sending, finished_recving = sending, recving
            out.append(("get_finished", sorted(sending or ()), sorted(recving or ())))
            if async_ids:
                out.extend(("loaded asynchronously", (n, _digest(t[async_ids]))) for n, t in kv.items())
        elif kind == "get_block_ids_with_load_errors":
            out.append(("load errors", sorted(clock(worker.get_block_ids_with_load_errors))))
        elif kind == "build_connector_worker_meta":
            settle_device(kv)
            wm = clock(worker.build_connector_worker_meta)
            out.append(("worker meta", plain_worker_meta(wm)))
            output = KVConnectorOutput(
                finished_sending=finished_sending, finished_recving=finished_recving, kv_connector_worker_meta=wm
            )
        elif kind == "clear_connector_metadata":
            clock(worker.clear_connector_metadata)
    return None if output.is_empty() else output
