// Worker-side host arena: fixed-size slots in bounded chunks of host memory.
//
// Chunks are allocated on first use and never exceed the chunk size (large
// single pinned allocations fail on XPU and CUDA). Pinned where an accelerator
// exists, pageable on CPU-only torch. Each slot remembers the tag (block key and
// TP rank) it holds once its save completed, so a load checks what it reads.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "activekv/status.h"

namespace activekv {

inline constexpr std::int64_t kDefaultChunkBytes = std::int64_t{64} << 20;

class HostArena {
 public:
  HostArena(std::int64_t num_slots, std::int64_t slot_bytes, bool pin,
            std::int64_t chunk_bytes = kDefaultChunkBytes);
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  std::int64_t num_slots() const { return num_slots_; }
  std::int64_t slot_bytes() const { return slot_bytes_; }
  std::int64_t slots_per_chunk() const { return slots_per_chunk_; }
  std::int64_t allocated_chunks() const;

  // The slot's bytes [offset, offset + nbytes), allocating its chunk on first
  // use. Errors: kOutOfRange (bad slot), kOutOfMemory (allocation refused).
  Result<at::Tensor> view(std::int64_t slot, std::int64_t offset, std::int64_t nbytes);

  // Copies `data` (uint8, 1-D) into the slot at `offset`; the slot's tag is
  // cleared until seal() says the whole slot is written.
  Status write(std::int64_t slot, std::int64_t offset, const at::Tensor& data);
  void seal(std::int64_t slot, std::string tag);
  // The sealed tag, or nullopt (unsealed or out of range).
  std::optional<std::string> tag(std::int64_t slot) const;
  std::vector<std::int64_t> sealed_slots() const;

 private:
  std::int64_t num_slots_;
  std::int64_t slot_bytes_;
  bool pin_;
  std::int64_t slots_per_chunk_;
  std::vector<at::Tensor> chunks_;  // undefined until first use; each owns its memory
  std::vector<std::optional<std::string>> tags_;
};

}  // namespace activekv
