// One host store's index shared by every vLLM on the host that names the
// store. The block data lives in the store files
// (store_file.h, one per tensor-parallel rank), which every instance maps;
// this is the scheduler's index of them, in a memory-mapped file of its own
// next to them ("<store_path>.index"), so a block one instance saved is found
// by the others once its save completed, and eviction is global (least
// recently used across instances).
//
// Why shared memory and not a store process: a lookup is a few hundred
// nanoseconds under an uncontended process-shared mutex, against an IPC round
// trip per lookup, and there is no extra process to launch, supervise and
// restart. What a crash may leave is handled where it is found:
//   - a holder dying inside the lock: the mutex is robust (EOWNERDEAD), and the
//     next holder rebuilds the derived tables (free slots, the hash table)
//     from the slots' own entries;
//   - a dead instance's pending saves and load pins: every instance holds an
//     open file description lock on its own byte of the index file, which the
//     kernel drops with the process; an instance found dead has its pins
//     cleared and its pending slots retired (their bytes never became visible,
//     but a worker of it may still be copying into them: they are not handed
//     out again until the next full restart recovers them from the files);
//   - the whole host restarting: the first instance to attach (no instance
//     byte held) rebuilds the index from the store files' sealed slots.
// cache_salt isolation needs nothing here: the salt is in the block key.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "activekv/block_index.h"
#include "activekv/status.h"

namespace activekv {
namespace detail {
struct MappedFile;
}  // namespace detail

class SharedBlockIndex final : public StoreIndex {
 public:
  // The most instances that share one store at a time.
  static constexpr int kMaxInstances = 64;

  // Opens or creates the index file at `path` for a store of `num_slots`
  // slots (every instance must agree, as the store files' geometry does).
  // The first instance to attach rebuilds it from `sealed_blocks()` (oldest
  // first); later ones join it as it is. Errors name the path.
  static Result<std::unique_ptr<SharedBlockIndex>> open(
      const std::string& path, std::int64_t num_slots,
      const std::function<Result<std::vector<std::pair<BlockKey, std::int64_t>>>()>& sealed_blocks);
  ~SharedBlockIndex() override;
  SharedBlockIndex(const SharedBlockIndex&) = delete;
  SharedBlockIndex& operator=(const SharedBlockIndex&) = delete;

  std::int64_t num_slots() const override { return num_slots_; }
  // Looking a block up makes it the most recently used: another instance's
  // eviction then takes older blocks first before this one's pin lands.
  std::optional<std::int64_t> lookup(const BlockKey& key) const override;
  bool contains(const BlockKey& key) const override;
  void touch(const BlockKey& key) override;
  std::optional<std::int64_t> pin(const BlockKey& key) override;
  void unpin(std::int64_t slot) override;
  Reservation reserve(const BlockKey& key) override;
  void commit(std::int64_t slot) override;
  void discard(std::int64_t slot) override;
  void retire(std::int64_t slot) override;
  std::int64_t restore(const std::vector<std::pair<BlockKey, std::int64_t>>& blocks) override;
  // Of the whole store, every instance's blocks: two numbers the index keeps
  // in its header, read under the lock.
  Occupancy occupancy() const override;

  // This instance's number (0..kMaxInstances-1), whether it joined live
  // instances, how many it restored when it was the first, and how many other
  // instances are attached now.
  int instance() const { return instance_; }
  bool joined() const { return joined_; }
  std::int64_t restored() const { return restored_; }
  int live_instances() const;
  // Visible blocks, of every instance (a scan: for tests and start-up lines).
  std::int64_t visible_blocks() const;
  // How often a holder died inside the lock and the next one rebuilt the
  // index's tables, since the index was made.
  std::uint64_t dead_holders() const;

 private:
  struct Header;
  struct Slot;
  class Locked;
  SharedBlockIndex() = default;
  // open's parts: the file made to this store's size (or, joined, checked to
  // have it), the header written (first instance) or checked (joined).
  Status size_file(const detail::MappedFile& file) const;
  void init_header() const;
  Status check_header() const;

  Header& header() const;
  Slot& slot_at(std::int64_t slot) const;
  std::int32_t* table() const;
  std::int32_t* free_stack() const;
  // Under the lock:
  std::int64_t find(const BlockKey& key) const;  // slot or -1
  void insert(const BlockKey& key, std::int64_t slot) const;
  void erase(const BlockKey& key) const;
  void free_slot(std::int64_t slot) const;
  void rebuild_derived() const;               // free stack, hash table and LRU list from the slots
  void link_newest(std::int64_t slot) const;  // LRU list: a visible slot in as the most recent
  void unlink(std::int64_t slot) const;       // LRU list: a visible slot out
  void used(std::int64_t slot) const;         // LRU list: a visible slot to the most recent
  void reclaim_dead() const;                  // dead instances' pending slots and pins
  void abandon(int instance) const;           // an instance's pins dropped, its pending slots retired
  bool alive(int instance) const;
  std::uint64_t tick() const;

  std::string path_;
  int fd_ = -1;
  std::uint8_t* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  std::int64_t num_slots_ = 0;
  std::int64_t table_size_ = 0;
  int instance_ = -1;
  bool joined_ = false;
  std::int64_t restored_ = 0;
  std::unordered_map<std::int64_t, int> pins_;  // this instance's loads in flight, per slot
};

}  // namespace activekv
