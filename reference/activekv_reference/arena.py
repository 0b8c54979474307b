"""Worker-side host arena: fixed-size slots in bounded chunks of host memory.

Chunks are allocated on first use and never exceed ``chunk_bytes`` (large
single pinned allocations fail on some accelerators). Each slot remembers the
block key it holds once its save completed, so a load can check it reads the
block the scheduler asked for.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK_BYTES = 64 << 20


class HostArena:
    def __init__(self, num_slots: int, slot_bytes: int, *, pin: bool, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.pin = pin
        self.slots_per_chunk = max(1, chunk_bytes // slot_bytes)
        num_chunks = -(-num_slots // self.slots_per_chunk)
        self._chunks: list[torch.Tensor | None] = [None] * num_chunks
        self._keys: list[bytes | None] = [None] * num_slots

    def _row(self, slot: int) -> torch.Tensor:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot} out of range (arena has {self.num_slots} slots)")
        c, r = divmod(slot, self.slots_per_chunk)
        chunk = self._chunks[c]
        if chunk is None:
            rows = min(self.slots_per_chunk, self.num_slots - c * self.slots_per_chunk)
            chunk = torch.empty((rows, self.slot_bytes), dtype=torch.uint8, pin_memory=self.pin)
            self._chunks[c] = chunk
        return chunk[r]

    def write(self, slot: int, offset: int, data: torch.Tensor) -> None:
        """Copy ``data`` (uint8, 1-D) into the slot at ``offset``; the key is cleared
        until ``seal`` says the whole slot is written."""
        row = self._row(slot)
        self._keys[slot] = None
        row[offset : offset + data.numel()].copy_(data)

    def unseal(self, slot: int) -> None:
        self._keys[slot] = None

    def seal(self, slot: int, key: bytes) -> None:
        self._keys[slot] = key

    def key(self, slot: int) -> bytes | None:
        return self._keys[slot] if 0 <= slot < self.num_slots else None

    def read(self, slot: int, offset: int, nbytes: int) -> torch.Tensor:
        return self._row(slot)[offset : offset + nbytes]

    def slot_data(self, slot: int) -> bytes:
        """The bytes of a sealed slot (for parity checks and tests)."""
        return self._row(slot).numpy().tobytes()

    def sealed_slots(self) -> list[int]:
        return [s for s, k in enumerate(self._keys) if k is not None]
