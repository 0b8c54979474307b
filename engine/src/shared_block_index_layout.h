// The shared store index's file, as every instance maps it: a header page,
// then the slots, the free stack and the open-addressing hash table
// (shared_block_index.cpp opens and locks it; shared_block_index_tables.cpp
// keeps its tables).
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>

#include "activekv/shared_block_index.h"

namespace activekv {
namespace shared_index {

constexpr std::size_t kHeaderBytes = 4096;
constexpr std::int32_t kEmpty = -1;      // hash table: never used
constexpr std::int32_t kTombstone = -2;  // hash table: erased

enum State : std::uint32_t { kFree = 0, kPending = 1, kVisible = 2, kRetired = 3 };

}  // namespace shared_index

struct SharedBlockIndex::Header {
  char magic[8];
  std::uint32_t format;
  std::uint32_t max_instances;
  std::int64_t num_slots;
  std::int64_t table_size;
  std::uint64_t clock;  // the last use's tick: LRU order across instances
  std::int64_t free_top;
  std::int64_t tombstones;
  std::uint64_t dead_holders;  // times a holder died inside the lock and the tables were rebuilt
  std::int32_t lru_head;       // the least recently used visible slot, or -1
  std::int32_t lru_tail;       // the most recently used, or -1
  pthread_mutex_t mutex;
  std::int64_t visible;  // slots on the LRU list (kVisible)
};

struct SharedBlockIndex::Slot {
  std::uint32_t state;      // State
  std::int32_t owner;       // pending: the instance saving it
  std::uint64_t last_use;   // the LRU list's order as ticks: it is rebuilt from them
  std::uint64_t pinned_by;  // bit i: instance i has a load from it in flight
  std::int32_t lru_prev;    // visible slots only: the LRU list, oldest first
  std::int32_t lru_next;
  BlockKey key;
};

}  // namespace activekv
