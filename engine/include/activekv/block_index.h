// Scheduler-side block index: which host slot holds which block.
//
// A slot is PENDING from the moment a save is planned until every worker has
// reported it sealed; only then is it VISIBLE to lookups. Visible slots are kept
// in LRU order; eviction takes the least recently used visible slot with no load
// in flight (pins == 0). Pending slots are never evicted.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "activekv/block_key.h"

namespace activekv {

enum class SlotState { kPending, kVisible };

class BlockIndex {
 public:
  explicit BlockIndex(std::int64_t num_slots);  // throws if num_slots <= 0
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  std::int64_t num_slots() const { return num_slots_; }
  std::size_t size() const { return by_key_.size(); }

  // Slot of a visible block; nullopt when absent or its save is pending.
  std::optional<std::int64_t> lookup(const BlockKey& key) const;
  // True if the block is stored or being stored.
  bool contains(const BlockKey& key) const { return by_key_.count(key) != 0; }
  std::optional<SlotState> state(const BlockKey& key) const;
  void touch(const BlockKey& key);

  // Protects a visible block from eviction while a load reads it; returns its
  // slot. Must only be called for a visible block.
  std::int64_t pin(const BlockKey& key);
  // Must be called once per pin, when the load finished.
  void unpin(std::int64_t slot);

  struct Reservation {
    std::optional<std::int64_t> slot;  // nullopt: every slot pending or pinned
    std::vector<BlockKey> evicted;
  };
  // Takes a PENDING slot for a block not in the index.
  Reservation reserve(const BlockKey& key);
  // The save into `slot` completed: the block becomes visible (most recent).
  void commit(std::int64_t slot);
  // Forgets the block in `slot` (failed save or load); no-op if gone or pinned.
  void discard(std::int64_t slot);
  // Takes `slot` out of service for good (a copy into it may still land).
  void retire(std::int64_t slot);
  // The blocks a store file kept across a restart (store_file.h), oldest
  // first: each visible in its slot, in that LRU order. One taken already
  // (its key or its slot) or out of range is skipped. Returns how many came back.
  std::int64_t restore(const std::vector<std::pair<BlockKey, std::int64_t>>& blocks);

 private:
  struct Entry {
    BlockKey key;
    std::int64_t slot;
    SlotState state;
    int pins = 0;
    std::list<BlockKey>::iterator lru_pos;  // valid when visible
  };
  void drop(Entry& entry);

  std::int64_t num_slots_;
  std::vector<std::int64_t> free_;  // back() is handed out next
  std::unordered_map<BlockKey, Entry, BlockKeyHash> by_key_;
  std::unordered_map<std::int64_t, BlockKey> key_of_slot_;
  std::list<BlockKey> lru_;  // visible, oldest first
};

}  // namespace activekv
