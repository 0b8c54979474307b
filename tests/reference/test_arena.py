from __future__ import annotations

import pytest
import torch
from activekv_reference.arena import HostArena


def test_slots_span_bounded_chunks_allocated_on_first_use():
    arena = HostArena(10, 100, pin=False, chunk_bytes=300)  # 3 slots per chunk
    assert arena.slots_per_chunk == 3
    assert all(c is None for c in arena._chunks)
    data = torch.arange(100, dtype=torch.uint8)
    arena.write(7, 0, data)
    assert sum(c is not None for c in arena._chunks) == 1
    assert max(c.numel() for c in arena._chunks if c is not None) <= 300


def test_slot_is_sealed_only_after_all_layers_are_written():
    arena = HostArena(2, 8, pin=False)
    arena.write(1, 0, torch.full((4,), 7, dtype=torch.uint8))
    arena.write(1, 4, torch.full((4,), 9, dtype=torch.uint8))
    assert arena.key(1) is None and arena.sealed_slots() == []
    arena.seal(1, b"k")
    assert arena.key(1) == b"k" and arena.slot_data(1) == bytes([7] * 4 + [9] * 4)
    arena.write(1, 0, torch.zeros(4, dtype=torch.uint8))  # overwrite unseals
    assert arena.key(1) is None


def test_out_of_range_slot_is_a_clear_error():
    arena = HostArena(2, 8, pin=False)
    with pytest.raises(IndexError, match="slot 2 out of range"):
        arena.write(2, 0, torch.zeros(8, dtype=torch.uint8))
    assert arena.key(99) is None
