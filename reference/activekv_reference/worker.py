"""Worker side: owns the host arena and moves blocks between it and the KV cache.

Per step, in the order vLLM calls it:
  start_load_kv        check every load's slot holds the expected block, then
                       stage all layers' host rows for the device (issued here);
  wait_for_layer_load  decode the layer's staged rows into the paged KV cache,
                       just before that layer's attention reads them;
  save_kv_layer        gather the layer's blocks to save, encode, start the copy
                       to host staging;
  wait_for_save        wait for the copies, write them into their slots and seal
                       them; the scheduler makes a slot visible only after all
                       workers reported it sealed.

A step that replays a full CUDA graph runs no per-layer hook: start_load_kv is
told so and decodes every layer's loads at once, before the forward, and
wait_for_save gathers the layers that save_kv_layer never saw, after it.
Layer streaming needs the hooks, so with it vLLM captures piecewise graphs only.
"""

from __future__ import annotations

import struct
import time
from collections import deque

import torch

from .arena import HostArena
from .codec import Codec, make_codec
from .config import ActiveKVConfig
from .layout import KVLayout
from .metadata import ActiveKVMetadata, ActiveKVWorkerMetadata, LoadOp
from .stats import ActiveKVStats, Telemetry
from .streaming import LayerStreamer, StreamingGeometry

_RECENT_FINISHED = 4096


def _elapsed_us(t0: float) -> int:
    return int((time.perf_counter() - t0) * 1e6)


class WorkerSide:
    def __init__(
        self,
        config: ActiveKVConfig,
        layout: KVLayout,
        num_slots: int,
        tp_rank: int,
        streaming: StreamingGeometry | None = None,
    ):
        self.config = config
        self.streaming = streaming
        self.streamer: LayerStreamer | None = None
        self.layout = layout
        self.num_slots = num_slots
        self.tp_rank = tp_rank
        self.layer_bytes = layout.layer_bytes(config.mode)
        self.layer_offset = {n: i * self.layer_bytes for i, n in enumerate(layout.layer_names)}
        self.stats = Telemetry(f"worker{tp_rank}")  # each worker a source of its own
        self.codec: Codec | None = None
        self.arena: HostArena | None = None
        self._kv: dict[str, torch.Tensor] = {}
        # Per-step state.
        self._load_ops: list[LoadOp] = []
        self._staged_loads: dict[str, torch.Tensor] = {}
        self._staged_saves: dict[str, torch.Tensor] = {}
        self._out = ActiveKVWorkerMetadata()
        self._load_error_blocks: set[int] = set()
        # Requests whose blocks vLLM keeps until we report their saves done.
        self._awaiting_free: set[str] = set()
        self._recent_finished: deque[str] = deque(maxlen=_RECENT_FINISHED)
        # Asynchronous loads landed since the last get_finished: each request
        # with the report of its slots.
        self._landed_async: list[tuple[str, ActiveKVWorkerMetadata]] = []

    # -- set-up ---------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        missing = [n for n in self.layout.layer_names if n not in kv_caches]
        if missing:
            raise ValueError(f"ActiveKV: KV cache of layer {missing[0]!r} was not registered")
        shapes = {tuple(kv_caches[n].shape[1:]) for n in self.layout.layer_names}
        first = kv_caches[self.layout.layer_names[0]]
        if len(shapes) != 1 or first[0].numel() != self.layout.block_numel:
            raise ValueError(
                f"ActiveKV: per-layer KV blocks of shape {sorted(shapes)} do not match "
                f"the KV cache spec ({self.layout.block_numel} elements per block)"
            )
        if first.dtype != self.layout.dtype:
            raise ValueError(f"ActiveKV: KV cache dtype {first.dtype} != spec {self.layout.dtype}")
        self._kv = {n: kv_caches[n] for n in self.layout.layer_names}
        if self.streaming is not None:
            self.streamer = LayerStreamer(self.streaming, self._kv, self.layout.head_size)
        self.codec = make_codec(self.config.mode, shapes.pop(), self.layout.dtype, self.layout.head_size)
        self.arena = HostArena(
            self.num_slots,
            self.layout.slot_bytes(self.config.mode),
            pin=first.device.type != "cpu",
        )

    def tag(self, key: bytes) -> bytes:
        """What a sealed slot records: the block key and this worker's TP rank."""
        return key + struct.pack("<I", self.tp_rank)

    def check_plan(self, meta: ActiveKVMetadata) -> None:
        """Every block id and slot of the step must exist (IndexError, nothing done)."""
        num_blocks = next(iter(self._kv.values())).shape[0]
        for op in [*meta.loads, *(op for a in meta.async_loads for op in a.loads), *meta.saves]:
            if not 0 <= op.block_id < num_blocks:
                raise IndexError(f"block id {op.block_id} out of range (the KV cache has {num_blocks} blocks)")
            if not 0 <= op.slot < self.num_slots:
                raise IndexError(f"slot {op.slot} out of range (arena has {self.num_slots} slots)")
        for block in [*meta.stage_blocks, *meta.writeback_blocks]:
            if not 0 <= block < num_blocks:
                raise IndexError(f"block id {block} out of range (the KV cache has {num_blocks} blocks)")
        if self.streamer is not None:
            self.streamer.check_rows(meta.stage_blocks, meta.stage_rows)
            self.streamer.check_rows(meta.writeback_blocks, meta.writeback_rows)
        for op in meta.saves:  # their bytes are about to be rewritten
            self.arena.unseal(op.slot)
        # Here, not in wait_for_save: vLLM 0.26.0 calls wait_for_save only on
        # steps with a forward; a request's last saves may settle on an idle step.
        self._awaiting_free.update(meta.awaiting_free)
        if self.streamer is not None:
            self.streamer.begin_step(meta.stage_blocks, meta.stage_rows, meta.writeback_blocks, meta.writeback_rows)

    # -- loads ----------------------------------------------------------------
    def start_load_kv(self, meta: ActiveKVMetadata, layer_hooks: bool = True) -> None:
        """`layer_hooks`: whether wait_for_layer_load runs this step; when it
        does not, every layer's loads land here, before the forward. The
        asynchronous loads land here too (this reference copies at once), and
        get_finished names their requests."""
        self._load_ops = []
        self._staged_loads = {}
        for load in meta.async_loads:
            # Its slots are reported with its request, in get_finished.
            out = ActiveKVWorkerMetadata()
            loaded = self._stage_loads(load.loads, out, layer_hooks=False)
            self.stats.add("async_loaded_blocks", loaded)
            self._landed_async.append((load.req_id, out))
        if meta.loads:
            self._stage_loads(meta.loads, self._out, layer_hooks)

    def _checked(self, ops: list[LoadOp], out: ActiveKVWorkerMetadata) -> list[LoadOp]:
        """The loads whose slot holds the block asked for; the others failed."""
        good = []
        for op in ops:
            out.loaded.append(op.slot)
            if self.arena.key(op.slot) == self.tag(op.key):
                good.append(op)
            else:  # never serve bytes that are not the block asked for
                out.failed_loads.append(op.slot)
                self._load_error_blocks.add(op.block_id)
                self.stats.add("failed_loads", 1)
        return good

    def _stage_loads(self, ops: list[LoadOp], out: ActiveKVWorkerMetadata, layer_hooks: bool) -> int:
        """Stages `ops`' blocks (lands them now without layer hooks); returns
        how many loaded (the others failed)."""
        assert self.arena is not None
        t0 = time.perf_counter()
        self._load_ops = self._checked(ops, out)
        for name in self.layout.layer_names:
            if not self._load_ops:
                break
            rows = torch.stack(
                [self.arena.read(op.slot, self.layer_offset[name], self.layer_bytes) for op in self._load_ops]
            )
            self._staged_loads[name] = rows.to(self._kv[name].device, non_blocking=True)
        n = len(self._load_ops)
        self.stats.add("loaded_blocks", n)
        self.stats.add("bytes_to_device", n * self.layer_bytes * len(self.layout.layer_names))
        self.stats.add("load_us", _elapsed_us(t0))
        if not layer_hooks:
            for name in self.layout.layer_names:
                self._decode_loads(name)
        return n

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Streamed layers: their read blocks first, the step's loads on top.
        if self.streamer is not None:
            self.streamer.stage(layer_name, self._kv[layer_name], self.stats)
        self._decode_loads(layer_name)

    def _decode_loads(self, layer_name: str) -> None:
        staged = self._staged_loads.pop(layer_name, None)
        if staged is None:
            return
        assert self.codec is not None
        t0 = time.perf_counter()
        block_ids = torch.tensor([op.block_id for op in self._load_ops], device=staged.device)
        self._kv[layer_name].index_copy_(0, block_ids, self.codec.decode(staged))
        self.stats.add("load_us", _elapsed_us(t0))

    # -- saves ----------------------------------------------------------------
    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, meta: ActiveKVMetadata) -> None:
        if self.streamer is not None:
            self.streamer.write_back(layer_name, kv_layer, self.stats)
        if not meta.saves or layer_name not in self.layer_offset:
            return
        self._stage_saves(layer_name, kv_layer, meta)

    def _stage_saves(self, layer_name: str, kv_layer: torch.Tensor, meta: ActiveKVMetadata) -> None:
        assert self.codec is not None
        t0 = time.perf_counter()
        block_ids = torch.tensor([op.block_id for op in meta.saves], device=kv_layer.device)
        encoded = self.codec.encode(kv_layer.index_select(0, block_ids))
        self._staged_saves[layer_name] = encoded.to("cpu", non_blocking=True)
        self.stats.add("save_us", _elapsed_us(t0))

    def wait_for_save(self, meta: ActiveKVMetadata | None) -> None:
        if meta is not None and meta.saves and self.streamer is None:
            # Layers save_kv_layer never saw (a full CUDA graph runs no hook):
            # once the forward is done their blocks are final, here as there.
            for name in self.layout.layer_names:
                if name not in self._staged_saves:
                    self._stage_saves(name, self._kv[name], meta)
        staged, self._staged_saves = self._staged_saves, {}
        if meta is None:
            return
        ops = meta.saves
        if not ops:
            return
        assert self.arena is not None
        t0 = time.perf_counter()
        if any(t.device.type != "cpu" for t in self._kv.values()):
            torch.accelerator.synchronize()
        if len(staged) != len(self.layout.layer_names):
            # A streamed layer never reached save_kv_layer (its KV is gone from
            # the ring by now): no slot of this step is whole.
            self._out.failed_saves.extend(op.slot for op in ops)
            return
        for i, op in enumerate(ops):
            for name, rows in staged.items():
                self.arena.write(op.slot, self.layer_offset[name], rows[i])
            self.arena.seal(op.slot, self.tag(op.key))
            self._out.saved.append(op.slot)
        self.stats.add("saved_blocks", len(ops))
        self.stats.add("bytes_to_host", len(ops) * self.arena.slot_bytes)
        self.stats.add("save_us", _elapsed_us(t0))

    # -- reporting ------------------------------------------------------------
    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        # Saves complete inside wait_for_save, so a finished request that the
        # scheduler kept for its saves can be released as soon as both the
        # notice and its finish have arrived.
        self._recent_finished.extend(finished_req_ids)
        done = {r for r in self._awaiting_free if r in self._recent_finished}
        self._awaiting_free -= done
        loaded = set()
        for req_id, out in self._landed_async:
            self._out.loaded.extend(out.loaded)
            self._out.failed_loads.extend(out.failed_loads)
            loaded.add(req_id)
        self._landed_async = []
        return (done or None), (loaded or None)

    def take_load_errors(self) -> set[int]:
        errors, self._load_error_blocks = self._load_error_blocks, set()
        return errors

    def take_stats(self) -> ActiveKVStats | None:
        """The counters since the last take (vLLM takes once a step) and, with
        streaming, the gauges of the step's streamed bytes each way."""
        if self.streaming is not None:
            self.stats.set("streamed_step_bytes_to_device", self.stats.data["streamed_bytes_to_device"])
            self.stats.set("streamed_step_bytes_to_host", self.stats.data["streamed_bytes_to_host"])
        return self.stats.take()

    def take_worker_meta(self) -> ActiveKVWorkerMetadata | None:
        out, self._out = self._out, ActiveKVWorkerMetadata()
        if not (out.saved or out.failed_saves or out.loaded or out.failed_loads or out.quarantined):
            return None
        return out
