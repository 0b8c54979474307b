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

// What the scheduler asks of a host store's index: BlockIndex (this process's
// own store) and SharedBlockIndex (one store for every vLLM on the host,
// shared_block_index.h) answer alike.
class StoreIndex {
 public:
  virtual ~StoreIndex() = default;
  virtual std::int64_t num_slots() const = 0;
  // Slot of a visible block; nullopt when absent or its save is pending.
  virtual std::optional<std::int64_t> lookup(const BlockKey& key) const = 0;
  // True if the block is stored or being stored.
  virtual bool contains(const BlockKey& key) const = 0;
  virtual void touch(const BlockKey& key) = 0;
  // Protects a visible block from eviction while a load reads it; returns its
  // slot, or nullopt where it is no longer visible (another process sharing
  // the store evicted it since the lookup).
  virtual std::optional<std::int64_t> pin(const BlockKey& key) = 0;
  // Must be called once per pin, when the load finished.
  virtual void unpin(std::int64_t slot) = 0;
  struct Reservation {
    std::optional<std::int64_t>
        slot;  // nullopt: every slot pending or pinned, or (stored_elsewhere) not needed
    std::vector<BlockKey> evicted;
    bool stored_elsewhere = false;  // another process took the block since contains()
  };
  // Takes a PENDING slot for a block not in the index.
  virtual Reservation reserve(const BlockKey& key) = 0;
  // The save into `slot` completed: the block becomes visible (most recent).
  virtual void commit(std::int64_t slot) = 0;
  // Forgets the block in `slot` (failed save or load); no-op if gone or pinned.
  virtual void discard(std::int64_t slot) = 0;
  // Takes `slot` out of service for good (a copy into it may still land).
  virtual void retire(std::int64_t slot) = 0;
  // The blocks a store file kept across a restart (store_file.h), oldest
  // first: each visible in its slot, in that LRU order. One taken already
  // (its key or its slot) or out of range is skipped. Returns how many came back.
  virtual std::int64_t restore(const std::vector<std::pair<BlockKey, std::int64_t>>& blocks) = 0;
  // How the slots are taken now, for the telemetry's gauges (cheap: read
  // every step). The rest of num_slots() are pending saves and retired slots.
  struct Occupancy {
    std::int64_t visible = 0;  // blocks lookups can find
    std::int64_t free = 0;     // slots holding nothing
  };
  virtual Occupancy occupancy() const = 0;
};

class BlockIndex final : public StoreIndex {
 public:
  explicit BlockIndex(std::int64_t num_slots);  // throws if num_slots <= 0
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  std::int64_t num_slots() const override { return num_slots_; }
  std::size_t size() const { return by_key_.size(); }

  std::optional<std::int64_t> lookup(const BlockKey& key) const override;
  bool contains(const BlockKey& key) const override { return by_key_.count(key) != 0; }
  std::optional<SlotState> state(const BlockKey& key) const;
  void touch(const BlockKey& key) override;
  // Must only be called for a visible block (std::logic_error otherwise).
  std::optional<std::int64_t> pin(const BlockKey& key) override;
  void unpin(std::int64_t slot) override;
  Reservation reserve(const BlockKey& key) override;
  void commit(std::int64_t slot) override;
  void discard(std::int64_t slot) override;
  void retire(std::int64_t slot) override;
  std::int64_t restore(const std::vector<std::pair<BlockKey, std::int64_t>>& blocks) override;
  Occupancy occupancy() const override {
    return {static_cast<std::int64_t>(lru_.size()), static_cast<std::int64_t>(free_.size())};
  }

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
