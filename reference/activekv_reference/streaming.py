"""Layer streaming: contexts longer than the device's KV memory.

Geometry. The first R layers of the KV cache group (in vLLM's order) are
*resident*: their KV stays on the device. The other L - R layers are
*streamed*: the host holds every block of theirs (the block's *home*, a row
that the scheduler gives each block, laid out so a request's blocks lie in
long runs of consecutive rows: homes.py), and the device holds a ring of K
buffers, each one layer's worth of blocks. Streamed layer j (0-based among the
streamed) uses buffer j % K: vLLM views its KV cache onto that buffer
(get_kv_cache_regions; patches/vllm/0.32.0/0002), so its block table, its
attention kernel and its KV cache update work unchanged. A budget that held
B blocks of L layers now holds B * L / (R + K) blocks.

Per step and streamed layer, in vLLM's order:
  before the layer's KV cache update (wait_for_layer_load, which vLLM calls
      there for a connector that asks, loads_before_kv_cache_update): copy the
      layer's home rows of every block the step reads and whose home holds its
      bytes (stage_blocks: not the blocks the step gives new content, nor the
      ones it loads) into its buffer; the step's loads from the host store
      then land on top, as for a resident layer;
  after the layer's attention (save_kv_layer): copy the blocks the step wrote
      or loaded (writeback_blocks) from the buffer back to their homes; the
      buffer then serves the streamed layer K places later.
The scheduler side decides both lists and their rows from the scheduled
requests' block tables (SchedulerSide._plan_streaming); a block several
requests read is staged once.

Homes hold each block as its codec encodes it (codec.py): exact bytes, or with
``homes = "compressed"`` int8 + scales (0.52x the bytes at head size 128, so the
bus time),
decoded into the buffer at staging and encoded from it at each write-back. A
block the step writes into (the last, partly filled one) is staged decoded, so
its earlier tokens are encoded again from their decoded values: that changes
nothing where a head_size row is one token's (decode then encode is the
identity on decoded bytes), and re-quantizes a row that spans tokens (vLLM's
CPU cache keeps K transposed); tests/vllm/test_compressed_homes.py bounds it. A
block the step writes and does not stage starts as zeros in the buffer, so its
encode never sees what the buffer's previous occupant left in unused slots.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from .codec import make_codec
from .config import ConfigError, Mode, StreamingConfig
from .homes import rows_for
from .layout import UnsupportedLayoutError

STREAMING_KEY = "kv_connector_extra_config['streaming']"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class StreamingGeometry:
    layer_names: tuple[str, ...]
    resident_layers: int
    ring_size: int
    homes: Mode = "exact"

    @classmethod
    def plan(cls, config: StreamingConfig, layer_names) -> StreamingGeometry:
        """The geometry for these layers; ConfigError (naming the key)
        when streaming cannot save device memory with them."""
        names, r, k = tuple(layer_names), config.resident_layers, config.ring_size
        if r >= len(names):
            raise ConfigError(
                f"{STREAMING_KEY}['resident_layers']: {r} leaves no layer to stream; "
                f"this model has {len(names)} KV cache layers, so it accepts 0..{len(names) - 1}"
            )
        if r + k >= len(names):
            raise ConfigError(
                f"{STREAMING_KEY}: resident_layers + ring_size = {r} + {k} must be below the "
                f"model's {len(names)} KV cache layers, or streaming holds no more blocks "
                f"than the device does without it; lower resident_layers or ring_size"
            )
        return cls(names, r, k, config.homes)

    @property
    def resident(self) -> tuple[str, ...]:
        return self.layer_names[: self.resident_layers]

    @property
    def streamed(self) -> tuple[str, ...]:
        return self.layer_names[self.resident_layers :]

    def regions(self) -> list[list[str]]:
        """The layers sharing each region of the device KV cache: one per
        resident layer, then one per ring buffer."""
        rings = [list(self.streamed[i :: self.ring_size]) for i in range(self.ring_size)]
        return [[name] for name in self.resident] + rings

    def ring_of(self, name: str) -> int:
        return self.streamed.index(name) % self.ring_size


def check_streamable(vllm_config, kv_cache_groups) -> None:
    """Refuse, naming the setting, a model or vLLM setting streaming cannot serve."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    def refuse(why: str) -> None:
        raise ConfigError(f"{STREAMING_KEY}: layer streaming cannot serve {why}")

    model = vllm_config.model_config
    if getattr(model, "use_mla", False):
        refuse("a model with multi-head latent attention (MLA); turn streaming off for it")
    kinds = [type(g.kv_cache_spec).__name__ for g in kv_cache_groups]
    if len(kv_cache_groups) != 1 or type(kv_cache_groups[0].kv_cache_spec) is not FullAttentionSpec:
        refuse(f"KV cache groups {kinds}: it needs one full-attention group (no sliding-window or hybrid groups)")
    if getattr(kv_cache_groups[0].kv_cache_spec, "sliding_window", None) is not None:
        refuse("sliding-window attention; it needs full attention in every layer")
    num_layers = model.get_num_layers_by_block_type(vllm_config.parallel_config, "attention")
    if len(kv_cache_groups[0].layer_names) != num_layers:
        refuse(
            f"a model whose layers share KV ({num_layers} attention layers, "
            f"{len(kv_cache_groups[0].layer_names)} with a KV cache of their own)"
        )
    if vllm_config.speculative_config is not None:
        refuse("speculative decoding (speculative_config is set); turn one of them off")
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        refuse(
            "pipeline parallelism (pipeline_parallel_size "
            f"{vllm_config.parallel_config.pipeline_parallel_size}); use tensor parallelism"
        )


@dataclasses.dataclass(frozen=True)
class StartupReport:
    resident_layers: int
    streamed_layers: int
    ring_size: int
    device_blocks: int  # what vLLM holds with streaming
    device_blocks_without: int  # the same memory without streaming
    block_size: int
    host_bytes: int  # the streamed layers' homes, per worker
    decode_step_bytes: int  # host->device bytes of a max_model_len decode step, per worker
    homes: Mode = "exact"

    @classmethod
    def of(
        cls, geometry: StreamingGeometry, num_blocks: int, block_size: int, layer_bytes: int, max_model_len: int
    ) -> StartupReport:
        """``layer_bytes``: one block of one layer as its home holds it."""
        regions = geometry.resident_layers + geometry.ring_size
        streamed = len(geometry.streamed)
        return cls(
            resident_layers=geometry.resident_layers,
            streamed_layers=streamed,
            ring_size=geometry.ring_size,
            device_blocks=num_blocks,
            device_blocks_without=num_blocks * regions // len(geometry.layer_names),
            block_size=block_size,
            host_bytes=rows_for(num_blocks) * streamed * layer_bytes,
            decode_step_bytes=cdiv(max_model_len, block_size) * streamed * layer_bytes,
            homes=geometry.homes,
        )

    def line(self) -> str:
        tokens, without = self.device_blocks * self.block_size, self.device_blocks_without * self.block_size
        return (
            f"ActiveKV layer streaming: {self.resident_layers} resident + {self.streamed_layers} "
            f"streamed layers, ring of {self.ring_size}; the device holds {self.device_blocks} "
            f"blocks ({tokens} tokens), {without // self.block_size} blocks ({without} tokens) "
            f"without streaming; host memory reserved for the streamed layers "
            f"{self.host_bytes} bytes per worker; a full-context decode step moves "
            f"{self.decode_step_bytes} bytes host->device per worker"
            + (
                "; the homes are compressed (int8 + scales, lossy within the codec's bound)"
                if self.homes == "compressed"
                else ""
            )
        )


class LayerStreamer:
    """Worker side: the homes of the streamed layers and the copies in and out."""

    def __init__(self, geometry: StreamingGeometry, kv_caches: dict[str, torch.Tensor], head_size: int):
        self.geometry = geometry
        self._check_aliasing(kv_caches)
        first = kv_caches[geometry.streamed[0]]
        pin = first.device.type != "cpu"
        self.num_blocks = first.shape[0]
        self.num_rows = rows_for(self.num_blocks)
        self.codec = make_codec(geometry.homes, tuple(first.shape[1:]), first.dtype, head_size)
        # One home per streamed layer: its blocks' encoded bytes, by home row.
        self.homes = {
            name: torch.zeros((self.num_rows, self.codec.layer_bytes()), dtype=torch.uint8, pin_memory=pin)
            for name in geometry.streamed
        }
        self._stage: tuple[torch.Tensor, torch.Tensor] | None = None
        self._fresh: torch.Tensor | None = None
        self._writeback: tuple[torch.Tensor, torch.Tensor] | None = None
        self._staged: set[str] = set()

    def check_rows(self, blocks: list[int], rows: list[int]) -> None:
        """One home row per block, each in range (IndexError otherwise)."""
        if len(rows) != len(blocks):
            raise IndexError(f"{len(rows)} home rows for {len(blocks)} streamed blocks")
        for row in rows:
            if not 0 <= row < self.num_rows:
                raise IndexError(f"home row {row} out of range (the homes have {self.num_rows} rows)")

    def _check_aliasing(self, kv_caches: dict[str, torch.Tensor]) -> None:
        ring_ptr: dict[int, int] = {}
        for name in self.geometry.streamed:
            ptr, ring = kv_caches[name].data_ptr(), self.geometry.ring_of(name)
            if ring_ptr.setdefault(ring, ptr) != ptr:
                raise UnsupportedLayoutError(
                    f"ActiveKV layer streaming: the KV cache of layer {name!r} is not a view of "
                    f"ring buffer {ring}; vLLM must carry ActiveKV's patch series "
                    "(0002, get_kv_cache_regions) for streaming"
                )

    def begin_step(
        self, stage_blocks: list[int], stage_rows: list[int], writeback_blocks: list[int], writeback_rows: list[int]
    ) -> None:
        def pairs(blocks, rows):
            if not blocks:
                return None
            return torch.tensor(blocks, dtype=torch.long), torch.tensor(rows, dtype=torch.long)

        self._stage = pairs(stage_blocks, stage_rows)
        self._writeback = pairs(writeback_blocks, writeback_rows)
        # Compressed homes: the blocks the step writes but does not stage (new,
        # or loaded) start as zeros in the buffer. A head vector of some layouts
        # (vLLM's CPU cache) spans several tokens, so the encode of a partly
        # filled block must not see what the buffer's previous occupant left
        # in its unused slots.
        fresh = sorted(set(writeback_blocks) - set(stage_blocks))
        compressed = self.geometry.homes == "compressed"
        self._fresh = torch.tensor(fresh, dtype=torch.long) if compressed and fresh else None
        self._staged = set()

    def stage(self, name: str, kv: torch.Tensor, stats) -> None:
        """Home -> ring buffer for the step's read blocks; once per layer and step."""
        if name in self._staged or name not in self.homes:
            return
        self._staged.add(name)
        if self._fresh is not None:
            kv.index_fill_(0, self._fresh.to(kv.device), 0)
        if self._stage is None:
            return
        t0 = time.perf_counter()
        blocks, rows = self._stage
        data = self.homes[name].index_select(0, rows)
        kv.index_copy_(0, blocks.to(kv.device), self.codec.decode(data.to(kv.device)))
        stats.add("streamed_bytes_to_device", data.numel() * data.element_size())
        stats.add("stream_us", int((time.perf_counter() - t0) * 1e6))

    def write_back(self, name: str, kv: torch.Tensor, stats) -> None:
        """Ring buffer -> home for the blocks the step wrote or loaded."""
        if self._writeback is None or name not in self.homes:
            return
        t0 = time.perf_counter()
        blocks, rows = self._writeback
        data = self.codec.encode(kv.index_select(0, blocks.to(kv.device))).cpu()
        self.homes[name].index_copy_(0, rows, data)
        stats.add("streamed_bytes_to_host", data.numel() * data.element_size())
        stats.add("stream_us", int((time.perf_counter() - t0) * 1e6))
