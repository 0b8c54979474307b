"""KV codecs: how one layer's blocks become host bytes and back.

``exact`` stores the bytes as they are. ``compressed`` stores each head vector
(``head_size`` contiguous elements: one token, one head, K or V) as int8 with one
float32 scale:

    scale = amax(|x|) / 127          (1.0 where amax == 0)
    q     = clamp(round_half_even(x / scale), -127, 127)
    x'    = (q * scale) cast to the KV dtype

Error bound, per element: |x - x'| <= amax / 254 + u * |x'|, where u is the unit
roundoff of the KV dtype (2**-8 for bf16, 2**-11 for fp16). For bf16 KV a block
costs (1 + 4 / head_size) / 2 of its exact size: 0.5625 at head_size 32.
Encoding is deterministic: the same input gives the same bytes.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .config import Mode

_SCALE_DTYPE = torch.float32
_QMAX = 127.0


class Codec(Protocol):
    def layer_bytes(self) -> int:
        """Host bytes of one block of one layer."""
        ...

    def encode(self, blocks: torch.Tensor) -> torch.Tensor:
        """[n, *block_shape] KV -> [n, layer_bytes] uint8 (same device)."""
        ...

    def decode(self, data: torch.Tensor) -> torch.Tensor:
        """[n, layer_bytes] uint8 -> [n, *block_shape] KV (same device)."""
        ...


class ExactCodec:
    def __init__(self, block_shape: tuple[int, ...], dtype: torch.dtype):
        self.block_shape = block_shape
        self.dtype = dtype
        self._numel = _numel(block_shape)

    def layer_bytes(self) -> int:
        return layer_bytes("exact", self._numel, self.dtype, 0)

    def encode(self, blocks: torch.Tensor) -> torch.Tensor:
        return blocks.reshape(blocks.shape[0], self._numel).view(torch.uint8)

    def decode(self, data: torch.Tensor) -> torch.Tensor:
        return data.view(self.dtype).reshape(data.shape[0], *self.block_shape)


class CompressedCodec:
    def __init__(self, block_shape: tuple[int, ...], dtype: torch.dtype, head_size: int):
        numel = _numel(block_shape)
        if block_shape[-1] % head_size:
            raise ValueError(
                f"compressed mode needs the innermost KV dim ({block_shape[-1]}) to be "
                f"a multiple of head_size ({head_size})"
            )
        self.block_shape = block_shape
        self.dtype = dtype
        self.head_size = head_size
        self._rows = numel // head_size
        self._qbytes = numel  # one int8 per element

    def layer_bytes(self) -> int:
        return layer_bytes("compressed", self._qbytes, self.dtype, self.head_size)

    def encode(self, blocks: torch.Tensor) -> torch.Tensor:
        n = blocks.shape[0]
        rows = blocks.reshape(n, self._rows, self.head_size).to(_SCALE_DTYPE)
        amax = rows.abs().amax(dim=-1, keepdim=True)
        # A tensor divisor on the blocks' device: CUDA divides by a Python
        # scalar as a multiply by its reciprocal, which rounds differently.
        qmax = torch.tensor(_QMAX, dtype=_SCALE_DTYPE, device=amax.device)
        scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
        q = torch.round(rows / scale).clamp_(-_QMAX, _QMAX).to(torch.int8)
        return torch.cat(
            [q.reshape(n, -1).view(torch.uint8), scale.reshape(n, -1).view(torch.uint8)],
            dim=1,
        )

    def decode(self, data: torch.Tensor) -> torch.Tensor:
        n = data.shape[0]
        q = data[:, : self._qbytes].contiguous().view(torch.int8)
        scale = data[:, self._qbytes :].contiguous().view(_SCALE_DTYPE)
        rows = q.reshape(n, self._rows, self.head_size).to(_SCALE_DTYPE) * scale.unsqueeze(-1)
        return rows.to(self.dtype).reshape(n, *self.block_shape)


def layer_bytes(mode: Mode, block_numel: int, dtype: torch.dtype, head_size: int) -> int:
    """Host bytes of one layer's block of ``block_numel`` KV elements."""
    if mode == "exact":
        return block_numel * dtype.itemsize
    return block_numel + (block_numel // head_size) * _SCALE_DTYPE.itemsize


def make_codec(mode: Mode, block_shape: tuple[int, ...], dtype: torch.dtype, head_size: int) -> Codec:
    if mode == "exact":
        return ExactCodec(block_shape, dtype)
    return CompressedCodec(block_shape, dtype, head_size)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
