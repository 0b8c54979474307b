// A host store's slots in a memory-mapped file that outlives the process
// (a warm restart serves from it). Plain bytes, no torch: the host
// arena (host_arena.h) maps its chunks onto chunk_data().
//
// Layout: a 4 KiB header (magic, format, the slot geometry, the identity of
// what the file holds: model, dtype, block size, layout, mode, ActiveKV's
// version), one 128-byte record per slot (state, tag, checksum), then the
// slots' data, page aligned, in the arena's chunks: chunk c holds slots
// [c * slots_per_chunk, ...) layer-major ([layers, rows, layer_bytes]), so a
// run of slots of one layer stays one contiguous range, and a slot's bytes
// are one piece per layer. The checksum covers a slot's pieces in layer order.
//
// Crash safety. A slot is served only once sealed, and sealing is ordered:
//   begin_write    the record says "writing" (durable) before the caller
//                  touches the data;
//   commit         the data's checksum and tag into the record, the data and
//                  the record flushed, then the record says "sealed" and is
//                  flushed again.
// A process killed anywhere leaves the slot "writing" or sealed with its
// checksum; open() verifies every sealed slot's checksum and drops (counts)
// the rest, so torn or stale bytes are never recovered. The checksum guards
// against torn writes, not against an adversary.
//
// Shared. Every vLLM that names the file maps it (MAP_SHARED: the page cache
// holds one copy) and holds an open file description lock on it, which the
// kernel drops when the holder dies (no stale lock). The first process to
// attach (nobody else holds it) recovers the file; the others join it as it
// is. Which process writes which slot is the shared index's decision
// (shared_block_index.h): a slot is written by one process at a time and never
// while another reads it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "activekv/block_key.h"
#include "activekv/config.h"
#include "activekv/status.h"

namespace activekv {

// What a sealed slot holds: the block key and the TP rank of the worker that
// saved it (host_arena.h's tag).
using StoreTag = std::array<std::uint8_t, 36>;

// The block key a tag begins with.
inline BlockKey key_of(const StoreTag& tag) {
  BlockKey key;
  std::copy(tag.begin(), tag.begin() + static_cast<std::ptrdiff_t>(key.size()), key.begin());
  return key;
}

struct StoreFileOptions {
  std::string path;
  std::int64_t num_slots = 0;
  std::int64_t slot_bytes = 0;  // all layers of a slot: num_layers x a layer's bytes
  std::int64_t num_layers = 1;
  std::int64_t slots_per_chunk = 0;  // 0: one chunk of every slot
  // Everything that must match for the bytes to be readable, as one line
  // (e.g. "model=<digest> dtype=bfloat16 block=16 layout=... mode=exact
  // activekv=<version>"); a file holding another identity is refused.
  std::string identity;
};

struct RecoveredSlot {
  std::int64_t slot;
  StoreTag tag;
  std::uint64_t sequence;  // commit order across restarts: the oldest is evicted first
};

class StoreFile {
 public:
  // Opens the file at options.path, or creates it (all its space reserved, so
  // a full disk fails here and never mid-save). An existing file is recovered:
  // sealed slots whose checksum verifies are recovered(), every other slot is
  // emptied. Errors name the path and what to do: a missing directory, a
  // read-only path, no space, a file held by a live process, a file of another
  // format, geometry or identity (left as it is).
  static Result<std::unique_ptr<StoreFile>> open(const StoreFileOptions& options);
  ~StoreFile();
  StoreFile(const StoreFile&) = delete;
  StoreFile& operator=(const StoreFile&) = delete;

  std::int64_t num_slots() const { return num_slots_; }
  std::int64_t slot_bytes() const { return slot_bytes_; }
  std::int64_t layer_bytes() const { return layer_bytes_; }
  std::int64_t num_layers() const { return num_layers_; }
  std::int64_t slots_per_chunk() const { return slots_per_chunk_; }
  // The [layers, rows, layer_bytes] bytes of a chunk (rows: slots_per_chunk,
  // fewer in the last chunk), and one layer's piece of a slot.
  std::uint8_t* chunk_data(std::int64_t chunk) const;
  std::int64_t chunk_rows(std::int64_t chunk) const;
  std::uint8_t* layer_data(std::int64_t slot, std::int64_t layer) const;

  // The crash-safe write of a slot (see above). Slots must be in range.
  void begin_write(std::int64_t slot);
  void commit(std::int64_t slot, const StoreTag& tag);
  // The slot is no longer served (eviction): empty, durable.
  void drop(std::int64_t slot);
  bool sealed(std::int64_t slot) const;
  // The tag of a sealed slot, whichever process sealed it; nullopt otherwise.
  std::optional<StoreTag> sealed_tag(std::int64_t slot) const;
  // Whether open() joined a file other live processes hold (then it did not
  // recover it: recovered() is empty).
  bool joined() const { return joined_; }
  // Every slot's bytes: one range of the mapping, which a device can register
  // (page-lock) for its copies. Whoever registers it must undo that before
  // the StoreFile goes (its destructor unmaps it).
  std::uint8_t* data() const { return map_ + data_offset_; }
  std::size_t data_bytes() const { return map_bytes_ - data_offset_; }

  // The sealed slots of the file at `path`, oldest commit first, read without
  // taking it (the scheduler's process rebuilds its index from them while a
  // worker holds the file, after that worker's open() verified them). Errors
  // for a file that is not a store, or (identity not empty) not this identity's.
  static Result<std::vector<RecoveredSlot>> read_sealed(const std::string& path, const std::string& identity);

  // What open() found in an existing file, oldest commit first.
  const std::vector<RecoveredSlot>& recovered() const { return recovered_; }
  std::int64_t dropped_writing() const { return dropped_writing_; }    // killed mid-write
  std::int64_t dropped_checksum() const { return dropped_checksum_; }  // bytes do not verify

 private:
  StoreFile() = default;
  struct Record;
  std::uint64_t& last_sequence() const;  // in the header: one counter for every process
  Record& record(std::int64_t slot) const;
  // Durable on a disk (msync); nothing on tmpfs.
  void flush(const void* at, std::size_t bytes) const;
  Status recover();
  std::uint64_t slot_checksum(std::int64_t slot) const;
  void flush_slot(std::int64_t slot) const;

  std::string path_;
  int fd_ = -1;
  std::uint8_t* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  std::int64_t num_slots_ = 0;
  std::int64_t slot_bytes_ = 0;
  std::int64_t layer_bytes_ = 0;
  std::int64_t num_layers_ = 1;
  std::int64_t slots_per_chunk_ = 0;
  std::size_t data_offset_ = 0;
  bool durable_ = true;  // flushes reach a disk (not tmpfs)
  std::vector<RecoveredSlot> recovered_;
  std::int64_t dropped_writing_ = 0;
  std::int64_t dropped_checksum_ = 0;
  bool joined_ = false;
};

// The file of one tensor-parallel rank: store_path itself with one rank,
// "<store_path>.rank<r>" with several (each rank's shard once).
std::string store_file_of_rank(const std::string& store_path, std::int64_t tp_rank, std::int64_t tp_size);

// What must match for a store file's bytes to be read back by rank `tp_rank`
// (StoreFileOptions::identity; the blocks' shape and strides are added when
// the KV caches are registered): the model's identity digest, the mode, the
// dtype and the rank of id.tp_size.
std::string store_file_identity(const ModelIdentity& id, Mode mode, std::int64_t tp_rank);

// The checksum of a slot's bytes (64-bit, fast: recovery reads every sealed
// byte of the file).
std::uint64_t store_checksum(const std::uint8_t* data, std::size_t bytes);

}  // namespace activekv
