"""Scheduler-side block index: which host slot holds which block.

A slot is PENDING from the moment a save is planned until every worker has
reported the save complete; only then is it VISIBLE to lookups. Visible slots
are kept in LRU order; eviction takes the least recently used visible slot
that has no load in flight (pins == 0). Pending slots are never evicted.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import OrderedDict

from .identity import BlockKey


class SlotState(enum.Enum):
    PENDING = "pending"
    VISIBLE = "visible"


@dataclasses.dataclass
class _Entry:
    key: BlockKey
    slot: int
    state: SlotState
    pins: int = 0


class BlockIndex:
    def __init__(self, num_slots: int):
        if num_slots <= 0:
            raise ValueError(f"the host store holds no block (num_slots={num_slots})")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._by_key: dict[BlockKey, _Entry] = {}
        self._by_slot: dict[int, _Entry] = {}
        self._lru: OrderedDict[BlockKey, None] = OrderedDict()  # visible, oldest first

    def __len__(self) -> int:
        return len(self._by_key)

    def lookup(self, key: BlockKey) -> int | None:
        """Slot of a visible block, or None (absent or save still pending)."""
        entry = self._by_key.get(key)
        if entry is None or entry.state is not SlotState.VISIBLE:
            return None
        return entry.slot

    def contains(self, key: BlockKey) -> bool:
        """True if the block is stored or being stored."""
        return key in self._by_key

    def touch(self, key: BlockKey) -> None:
        if key in self._lru:
            self._lru.move_to_end(key)

    def pin(self, key: BlockKey) -> int:
        """Protect a visible block from eviction while a load reads it."""
        entry = self._by_key[key]
        if entry.state is not SlotState.VISIBLE:
            raise RuntimeError("pinning a block whose save has not completed")
        entry.pins += 1
        self.touch(key)
        return entry.slot

    def unpin(self, slot: int) -> None:
        entry = self._by_slot.get(slot)
        if entry is None or entry.pins == 0:
            raise RuntimeError(f"unpin of slot {slot} without a load in flight")
        entry.pins -= 1

    def reserve(self, key: BlockKey) -> tuple[int | None, list[BlockKey]]:
        """Take a slot for a new block (PENDING). Returns (slot, evicted keys);
        slot is None when every slot is pending or pinned."""
        if key in self._by_key:
            raise RuntimeError("block already stored")
        evicted: list[BlockKey] = []
        if not self._free:
            victim = next((k for k in self._lru if self._by_key[k].pins == 0), None)
            if victim is None:
                return None, evicted
            self._drop(self._by_key[victim])
            evicted.append(victim)
        slot = self._free.pop()
        entry = _Entry(key=key, slot=slot, state=SlotState.PENDING)
        self._by_key[key] = entry
        self._by_slot[slot] = entry
        return slot, evicted

    def commit(self, slot: int) -> None:
        """The save into ``slot`` completed: the block becomes visible (most recent)."""
        entry = self._by_slot[slot]
        if entry.state is not SlotState.PENDING:
            raise RuntimeError(f"slot {slot} committed twice")
        entry.state = SlotState.VISIBLE
        self._lru[entry.key] = None

    def discard(self, slot: int) -> None:
        """Forget the block in ``slot`` (failed save or failed load); no-op if gone."""
        entry = self._by_slot.get(slot)
        if entry is not None and entry.pins == 0:
            self._drop(entry)

    def retire(self, slot: int) -> None:
        """Take `slot` out of service for good (a copy into it may still land)."""
        entry = self._by_slot.pop(slot, None)
        if entry is not None:
            del self._by_key[entry.key]
            self._lru.pop(entry.key, None)

    def occupancy(self) -> tuple[int, int]:
        """(visible blocks, free slots), for the telemetry's gauges; the rest
        of num_slots are pending saves and retired slots."""
        return len(self._lru), len(self._free)

    def state(self, key: BlockKey) -> SlotState | None:
        entry = self._by_key.get(key)
        return None if entry is None else entry.state

    def _drop(self, entry: _Entry) -> None:
        del self._by_key[entry.key]
        del self._by_slot[entry.slot]
        self._lru.pop(entry.key, None)
        self._free.append(entry.slot)
