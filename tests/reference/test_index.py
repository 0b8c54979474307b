from __future__ import annotations

import pytest
from activekv_reference.index import BlockIndex, SlotState


def k(i: int) -> bytes:
    return i.to_bytes(32, "little")


def stored(index: BlockIndex, *ids: int) -> None:
    for i in ids:
        slot, _ = index.reserve(k(i))
        index.commit(slot)


def test_block_invisible_until_its_save_is_committed():
    index = BlockIndex(4)
    slot, evicted = index.reserve(k(1))
    assert evicted == [] and index.contains(k(1))
    assert index.state(k(1)) is SlotState.PENDING and index.lookup(k(1)) is None
    index.commit(slot)
    assert index.lookup(k(1)) == slot


def test_full_store_evicts_least_recently_used():
    index = BlockIndex(3)
    stored(index, 1, 2, 3)
    index.touch(k(1))  # 2 is now the oldest
    slot, evicted = index.reserve(k(4))
    assert evicted == [k(2)] and slot is not None
    assert index.lookup(k(2)) is None and index.lookup(k(1)) is not None


def test_pinned_block_is_never_evicted():
    index = BlockIndex(2)
    stored(index, 1, 2)
    s1 = index.pin(k(1))
    index.pin(k(2))
    assert index.reserve(k(3)) == (None, [])  # everything pinned: no room
    index.unpin(s1)
    _, evicted = index.reserve(k(3))
    assert evicted == [k(1)]


def test_pending_blocks_are_never_evicted():
    index = BlockIndex(1)
    index.reserve(k(1))
    assert index.reserve(k(2)) == (None, [])


def test_discard_frees_the_slot_and_broken_contracts_raise():
    index = BlockIndex(1)
    slot, _ = index.reserve(k(1))
    index.discard(slot)
    assert not index.contains(k(1))
    assert index.reserve(k(2))[0] == slot
    with pytest.raises(RuntimeError):
        index.pin(k(2))  # still pending
    with pytest.raises(RuntimeError):
        index.unpin(slot)
    with pytest.raises(ValueError):
        BlockIndex(0)
