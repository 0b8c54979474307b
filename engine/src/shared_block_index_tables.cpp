// The shared store index's tables inside its mapped file
// (shared_block_index_layout.h): the hash table from key to slot, the free
// stack, the LRU list of visible slots, and their repair after a holder died
// inside the lock. Every call here runs with the index's mutex held.
#include <algorithm>
#include <vector>

#include "activekv/shared_block_index.h"
#include "shared_block_index_layout.h"

namespace activekv {

using namespace shared_index;  // NOLINT: the file's own layout

SharedBlockIndex::Header& SharedBlockIndex::header() const { return *reinterpret_cast<Header*>(map_); }

SharedBlockIndex::Slot& SharedBlockIndex::slot_at(std::int64_t slot) const {
  return reinterpret_cast<Slot*>(map_ + kHeaderBytes)[slot];
}

std::int32_t* SharedBlockIndex::free_stack() const {
  return reinterpret_cast<std::int32_t*>(map_ + kHeaderBytes +
                                         static_cast<std::size_t>(num_slots_) * sizeof(Slot));
}

std::int32_t* SharedBlockIndex::table() const { return free_stack() + num_slots_; }

std::int64_t SharedBlockIndex::find(const BlockKey& key) const {
  const auto mask = static_cast<std::size_t>(table_size_ - 1);
  for (std::size_t i = BlockKeyHash{}(key)&mask, n = 0; n < static_cast<std::size_t>(table_size_);
       i = (i + 1) & mask, ++n) {
    const std::int32_t s = table()[i];
    if (s == kEmpty) return -1;
    if (s >= 0 && slot_at(s).key == key) return s;
  }
  return -1;
}

void SharedBlockIndex::insert(const BlockKey& key, std::int64_t slot) const {
  const auto mask = static_cast<std::size_t>(table_size_ - 1);
  std::size_t i = BlockKeyHash{}(key)&mask;
  while (table()[i] >= 0) i = (i + 1) & mask;  // at most half full: always ends
  if (table()[i] == kTombstone) --header().tombstones;
  table()[i] = static_cast<std::int32_t>(slot);
}

void SharedBlockIndex::erase(const BlockKey& key) const {
  const auto mask = static_cast<std::size_t>(table_size_ - 1);
  for (std::size_t i = BlockKeyHash{}(key)&mask, n = 0; n < static_cast<std::size_t>(table_size_);
       i = (i + 1) & mask, ++n) {
    const std::int32_t s = table()[i];
    if (s == kEmpty) return;
    if (s >= 0 && slot_at(s).key == key) {
      table()[i] = kTombstone;
      ++header().tombstones;
      return;
    }
  }
}

void SharedBlockIndex::free_slot(std::int64_t slot) const {
  Slot& e = slot_at(slot);
  if (e.state == kVisible) unlink(slot);
  e.state = kFree;
  e.owner = -1;
  e.pinned_by = 0;
  free_stack()[header().free_top++] = static_cast<std::int32_t>(slot);
}

void SharedBlockIndex::rebuild_derived() const {
  Header& h = header();
  std::fill(table(), table() + table_size_, kEmpty);
  h.tombstones = 0;
  h.free_top = 0;
  h.lru_head = h.lru_tail = -1;
  h.visible = 0;
  for (std::int64_t s = num_slots_ - 1; s >= 0; --s) {  // slot 0 handed out first, as BlockIndex
    Slot& e = slot_at(s);
    if (e.state == kFree) {
      free_stack()[h.free_top++] = static_cast<std::int32_t>(s);
    } else if (e.state == kPending || e.state == kVisible) {
      if (find(e.key) >= 0) {  // a half-made entry of a holder that died: one slot per key
        e.state = kFree;
        free_stack()[h.free_top++] = static_cast<std::int32_t>(s);
      } else {
        insert(e.key, s);
      }
    }
  }
  // The LRU list in the order of the slots' last uses.
  std::vector<std::int32_t> visible;
  for (std::int64_t s = 0; s < num_slots_; ++s) {
    if (slot_at(s).state == kVisible) visible.push_back(static_cast<std::int32_t>(s));
  }
  std::sort(visible.begin(), visible.end(),
            [this](std::int32_t a, std::int32_t b) { return slot_at(a).last_use < slot_at(b).last_use; });
  for (const auto s : visible) link_newest(s);
}

void SharedBlockIndex::link_newest(std::int64_t slot) const {
  Header& h = header();
  Slot& e = slot_at(slot);
  e.lru_prev = h.lru_tail;
  e.lru_next = -1;
  (h.lru_tail >= 0 ? slot_at(h.lru_tail).lru_next : h.lru_head) = static_cast<std::int32_t>(slot);
  h.lru_tail = static_cast<std::int32_t>(slot);
  ++h.visible;
}

void SharedBlockIndex::unlink(std::int64_t slot) const {
  Header& h = header();
  const Slot& e = slot_at(slot);
  (e.lru_prev >= 0 ? slot_at(e.lru_prev).lru_next : h.lru_head) = e.lru_next;
  (e.lru_next >= 0 ? slot_at(e.lru_next).lru_prev : h.lru_tail) = e.lru_prev;
  --h.visible;
}

void SharedBlockIndex::used(std::int64_t slot) const {
  slot_at(slot).last_use = tick();
  unlink(slot);
  link_newest(slot);
}

void SharedBlockIndex::reclaim_dead() const {
  for (int i = 0; i < kMaxInstances; ++i) {
    if (!alive(i)) abandon(i);
  }
  for (std::int64_t s = 0; s < num_slots_; ++s) {  // a holder that died between reserve's writes
    Slot& e = slot_at(s);
    if (e.state == kPending && e.owner < 0) {
      erase(e.key);
      e.state = kRetired;
    }
  }
}

void SharedBlockIndex::abandon(int instance) const {
  const std::uint64_t bit = std::uint64_t{1} << instance;
  for (std::int64_t s = 0; s < num_slots_; ++s) {
    Slot& e = slot_at(s);
    e.pinned_by &= ~bit;  // a load's late read harms only the instance that is gone
    if (e.state == kPending && e.owner == instance) {
      // Its bytes never became visible, but a copy into the slot may still
      // land (a worker outliving its scheduler, or a closing instance's save
      // in flight): the slot is retired, never handed out again while the
      // index lives. The files' recovery frees it at the next full restart
      // (the record says "writing").
      erase(e.key);
      e.state = kRetired;
      e.owner = -1;
    }
  }
}

}  // namespace activekv
