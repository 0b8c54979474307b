from __future__ import annotations

import pytest
import torch
from activekv_reference.codec import CompressedCodec, ExactCodec, layer_bytes

SHAPE = (2, 32, 64)  # K/V, tokens, heads * head_size (vLLM's CPU layout)
HEAD = 32


def blocks(n=5, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn((n, *SHAPE), generator=g) * scale).to(torch.bfloat16)


def test_exact_round_trip_is_bitwise():
    codec = ExactCodec(SHAPE, torch.bfloat16)
    x = blocks()
    data = codec.encode(x)
    assert data.dtype == torch.uint8 and data.shape == (5, codec.layer_bytes())
    assert torch.equal(codec.decode(data.clone()).view(torch.int16), x.view(torch.int16))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_compressed_error_within_stated_bound(scale):
    codec = CompressedCodec(SHAPE, torch.bfloat16, HEAD)
    x = blocks(scale=scale)
    y = codec.decode(codec.encode(x))
    rows_x = x.float().reshape(5, -1, HEAD)
    rows_y = y.float().reshape(5, -1, HEAD)
    amax = rows_x.abs().amax(dim=-1, keepdim=True)
    bound = amax / 254 + 2.0**-8 * rows_y.abs()
    assert torch.all((rows_x - rows_y).abs() <= bound * (1 + 1e-6))


def test_compressed_is_deterministic_and_about_half_size():
    codec = CompressedCodec(SHAPE, torch.bfloat16, HEAD)
    x = blocks()
    assert torch.equal(codec.encode(x), codec.encode(x.clone()))
    exact = layer_bytes("exact", x[0].numel(), torch.bfloat16, HEAD)
    assert codec.layer_bytes() / exact == pytest.approx(0.5 + 2 / HEAD)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_compressed_encode_of_a_decode_gives_the_same_bytes(scale):
    # Compressed homes re-encode a staged block's decoded tokens at each
    # write-back; this is why that adds no error. The largest element decodes
    # to itself (so the scale repeats), and every other decodes within half a
    # bf16 ulp, under half a quantization step at 127 steps.
    codec = CompressedCodec(SHAPE, torch.bfloat16, HEAD)
    data = codec.encode(blocks(n=64, seed=3, scale=scale))
    assert torch.equal(codec.encode(codec.decode(data)), data)


def test_compressed_zero_block_stays_zero():
    codec = CompressedCodec(SHAPE, torch.bfloat16, HEAD)
    x = torch.zeros((1, *SHAPE), dtype=torch.bfloat16)
    assert torch.equal(codec.decode(codec.encode(x)), x)


def test_compressed_rejects_a_layout_it_cannot_split_into_heads():
    with pytest.raises(ValueError, match="head_size"):
        CompressedCodec((2, 32, 48), torch.bfloat16, 32)
