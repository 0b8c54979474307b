#include "activekv/block_index.h"

#include <stdexcept>
#include <string>

namespace activekv {

BlockIndex::BlockIndex(std::int64_t num_slots) : num_slots_(num_slots) {
  if (num_slots <= 0) {
    throw std::invalid_argument("the host store holds no block (num_slots=" + std::to_string(num_slots) +
                                ")");
  }
  free_.reserve(static_cast<std::size_t>(num_slots));
  for (std::int64_t s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

std::optional<std::int64_t> BlockIndex::lookup(const BlockKey& key) const {
  const auto it = by_key_.find(key);
  if (it == by_key_.end() || it->second.state != SlotState::kVisible) return std::nullopt;
  return it->second.slot;
}

std::optional<SlotState> BlockIndex::state(const BlockKey& key) const {
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  return it->second.state;
}

void BlockIndex::touch(const BlockKey& key) {
  const auto it = by_key_.find(key);
  if (it == by_key_.end() || it->second.state != SlotState::kVisible) return;
  lru_.splice(lru_.end(), lru_, it->second.lru_pos);
}

std::optional<std::int64_t> BlockIndex::pin(const BlockKey& key) {
  auto& entry = by_key_.at(key);
  if (entry.state != SlotState::kVisible) {
    throw std::logic_error("pinning a block whose save has not completed");
  }
  ++entry.pins;
  touch(key);
  return entry.slot;
}

void BlockIndex::unpin(std::int64_t slot) {
  const auto it = key_of_slot_.find(slot);
  if (it == key_of_slot_.end() || by_key_.at(it->second).pins == 0) {
    throw std::logic_error("unpin of slot " + std::to_string(slot) + " without a load in flight");
  }
  --by_key_.at(it->second).pins;
}

BlockIndex::Reservation BlockIndex::reserve(const BlockKey& key) {
  if (contains(key)) throw std::logic_error("block already stored");
  Reservation r;
  if (free_.empty()) {
    for (const BlockKey& victim : lru_) {
      auto& entry = by_key_.at(victim);
      if (entry.pins == 0) {
        r.evicted.push_back(victim);
        drop(entry);
        break;
      }
    }
    if (r.evicted.empty()) return r;
  }
  const std::int64_t slot = free_.back();
  free_.pop_back();
  by_key_.emplace(key, Entry{key, slot, SlotState::kPending, 0, {}});
  key_of_slot_.emplace(slot, key);
  r.slot = slot;
  return r;
}

void BlockIndex::commit(std::int64_t slot) {
  auto& entry = by_key_.at(key_of_slot_.at(slot));
  if (entry.state != SlotState::kPending) {
    throw std::logic_error("slot " + std::to_string(slot) + " committed twice");
  }
  entry.state = SlotState::kVisible;
  entry.lru_pos = lru_.insert(lru_.end(), entry.key);
}

std::int64_t BlockIndex::restore(const std::vector<std::pair<BlockKey, std::int64_t>>& blocks) {
  std::vector<char> is_free(static_cast<std::size_t>(num_slots_), 0);
  for (const auto slot : free_) is_free[static_cast<std::size_t>(slot)] = 1;
  std::int64_t restored = 0;
  for (const auto& [key, slot] : blocks) {
    if (slot < 0 || slot >= num_slots_ || !is_free[static_cast<std::size_t>(slot)] || contains(key)) continue;
    is_free[static_cast<std::size_t>(slot)] = 0;
    by_key_.emplace(key, Entry{key, slot, SlotState::kPending, 0, {}});
    key_of_slot_.emplace(slot, key);
    commit(slot);
    ++restored;
  }
  std::erase_if(free_, [&](std::int64_t slot) { return !is_free[static_cast<std::size_t>(slot)]; });
  return restored;
}

void BlockIndex::discard(std::int64_t slot) {
  const auto it = key_of_slot_.find(slot);
  if (it == key_of_slot_.end()) return;
  auto& entry = by_key_.at(it->second);
  if (entry.pins == 0) drop(entry);
}

void BlockIndex::retire(std::int64_t slot) {
  const auto it = key_of_slot_.find(slot);
  if (it == key_of_slot_.end()) return;
  auto& entry = by_key_.at(it->second);
  const BlockKey key = entry.key;
  if (entry.state == SlotState::kVisible) lru_.erase(entry.lru_pos);
  key_of_slot_.erase(slot);
  by_key_.erase(key);  // the slot is not returned to free_
}

void BlockIndex::drop(Entry& entry) {
  if (entry.state == SlotState::kVisible) lru_.erase(entry.lru_pos);
  const BlockKey key = entry.key;  // a copy: erasing destroys `entry`
  free_.push_back(entry.slot);
  key_of_slot_.erase(entry.slot);
  by_key_.erase(key);
}

}  // namespace activekv
