// Worker-side host arena: fixed-size slots in bounded chunks of host memory.
//
// Layer-major inside each chunk ([layers, slots, layer_bytes]), so a run of
// consecutive slots of one layer is one contiguous range: a block batch moves
// between the device and the arena with one copy per run, no host-side copy.
// Chunks are allocated on first use, or all at once (allocate_all), and never
// exceed the chunk size (large single pinned allocations fail on XPU and CUDA). Pinned where an accelerator
// exists, pageable on CPU-only torch. Each slot remembers the tag (block key and
// TP rank) it holds once its save completed, so a load checks what it reads.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "activekv/status.h"
#include "activekv/store_file.h"

namespace activekv {

inline constexpr std::int64_t kDefaultChunkBytes = std::int64_t{64} << 20;
inline constexpr std::int64_t kMaxChunkBytes = std::int64_t{256} << 20;

// The chunk size for a model of `num_layers` layers. A layer's run inside a
// chunk is chunk / num_layers bytes, so with many layers 64 MiB chunks cut a
// batch into copies too small for the copy engine's peak (2 MiB at 32 layers:
// 89.6% against 94.1% with 256 MiB, docs/benchmarks/history.md). Chunks grow by 8 MiB a
// layer, bounded at 256 MiB (never one giant pinned allocation).
inline std::int64_t chunk_bytes_for(std::int64_t num_layers) {
  return std::clamp(num_layers * (std::int64_t{8} << 20), kDefaultChunkBytes, kMaxChunkBytes);
}

// The right to write a batch of slots, from bind to seal. Each slot's generation
// moves on when a lease takes it and when a lease is quarantined, so a lease
// seals only slots still at the generation it took: a stale or quarantined
// lease can never make a slot visible.
struct SlotLease {
  std::vector<std::int64_t> slots;
  std::vector<std::uint32_t> generations;
  bool empty() const { return slots.empty(); }
};

// Consecutive slots [first, first + count) inside one chunk, at position
// `offset` of a batch.
struct SlotRun {
  std::int64_t first;
  std::int64_t count;
  std::int64_t offset;
};

class HostArena {
 public:
  HostArena(std::int64_t num_slots, std::int64_t num_layers, std::int64_t layer_bytes, bool pin,
            std::int64_t chunk_bytes = kDefaultChunkBytes);
  // The arena on a store file (store_file.h) of its geometry (throws
  // std::invalid_argument otherwise): its chunks are the file's, a lease
  // marks its slots "writing" there and a seal commits them, and a slot's tag
  // is its record's, so slots the file recovered, or that another process
  // sharing the file sealed, are sealed with their tags. Not pinned: the
  // device reads the mapping as pageable memory.
  HostArena(std::int64_t num_layers, std::int64_t layer_bytes, std::shared_ptr<StoreFile> file);
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  std::int64_t num_slots() const { return num_slots_; }
  std::int64_t slot_bytes() const { return num_layers_ * layer_bytes_; }
  std::int64_t layer_bytes() const { return layer_bytes_; }
  std::int64_t slots_per_chunk() const { return slots_per_chunk_; }
  std::int64_t num_chunks() const { return static_cast<std::int64_t>(chunks_.size()); }
  std::int64_t allocated_chunks() const;
  // Allocates every chunk now. Pinning costs about a second per 2 GiB and may
  // stall the device: a step must never pay it (measured on the H200: a first
  // save into fresh pinned chunks made a prompt's miss 2.6-3.6x slower).
  // Errors: kOutOfMemory, naming the bytes of the chunk refused.
  Status allocate_all();
  // The store file under the arena, or null (the arena lives in process memory).
  const StoreFile* file() const { return file_.get(); }

  // Splits a batch of slots into runs of consecutive slots within a chunk.
  std::vector<SlotRun> runs(const std::vector<std::int64_t>& slots) const;
  // Every slot in order, one run a chunk (offsets are slot numbers).
  std::vector<SlotRun> all_runs() const;

  // The [count, layer_bytes] bytes of `layer` for the run's slots, allocating
  // the chunk on first use. Errors: kOutOfRange, kOutOfMemory (refused).
  Result<at::Tensor> run_view(std::int64_t layer, const SlotRun& run);
  // The [rows, layer_bytes] bytes of `layer` for every slot of a chunk,
  // allocating it on first use. Errors as run_view.
  Result<at::Tensor> chunk_view(std::int64_t layer, std::int64_t chunk);

  // Takes the slots for writing: unseals them (nothing reads their bytes until
  // seal) and moves their generations on. Must be called with slots in range.
  SlotLease lease(const std::vector<std::int64_t>& slots);
  // Must be called only after every copy into the lease's slots completed.
  // Seals each slot with its tag (one per slot, in the lease's order), or
  // nothing at all: kStale names the first slot taken since by another lease
  // or quarantined.
  Status seal(const SlotLease& lease, const std::vector<std::string>& tags);
  // For a lease whose copies have an unknown outcome (fence error or
  // timeout): its slots stay unsealed and are never leased again.
  void quarantine(const SlotLease& lease);
  bool quarantined(std::int64_t slot) const { return quarantined_[static_cast<std::size_t>(slot)] != 0; }
  std::int64_t quarantined_count() const { return quarantined_count_; }
  std::uint32_t generation(std::int64_t slot) const { return generations_[static_cast<std::size_t>(slot)]; }
  // The sealed tag, or nullopt (unsealed or out of range).
  std::optional<std::string> tag(std::int64_t slot) const;
  // Whether the slot is sealed with `tag` (what a load checks; no copy).
  bool holds(std::int64_t slot, const std::string& tag) const;
  std::vector<std::int64_t> sealed_slots() const;
  // All layers of a slot, layer after layer (the reference's slot layout).
  Result<std::string> slot_data(std::int64_t slot);

 private:
  Status ensure_chunk(std::int64_t chunk);

  std::int64_t num_slots_;
  std::int64_t num_layers_;
  std::int64_t layer_bytes_;
  bool pin_;
  std::int64_t slots_per_chunk_;
  std::shared_ptr<StoreFile> file_;  // null: chunks in process memory
  std::vector<at::Tensor> chunks_;   // undefined until first use; each owns its memory or views the file's
  // Per slot, indexed by slot: dense (under 100 bytes a slot, against the
  // slot's own bytes), and no hashing or allocation on a step's path.
  std::vector<std::string> tags_;  // empty: unsealed (a tag is never empty); unused on a file
  std::vector<std::uint32_t> generations_;
  std::vector<char> quarantined_;
  std::int64_t quarantined_count_ = 0;
};

}  // namespace activekv
