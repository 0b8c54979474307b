#include "activekv/host_arena.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace activekv {

HostArena::HostArena(std::int64_t num_slots, std::int64_t slot_bytes, bool pin,
                     std::int64_t chunk_bytes)
    : num_slots_(num_slots),
      slot_bytes_(slot_bytes),
      pin_(pin),
      slots_per_chunk_(std::max<std::int64_t>(1, chunk_bytes / slot_bytes)),
      chunks_(static_cast<std::size_t>((num_slots + slots_per_chunk_ - 1) / slots_per_chunk_)),
      tags_(static_cast<std::size_t>(num_slots)) {}

std::int64_t HostArena::allocated_chunks() const {
  return std::count_if(chunks_.begin(), chunks_.end(), [](const auto& c) { return c.defined(); });
}

Result<at::Tensor> HostArena::view(std::int64_t slot, std::int64_t offset, std::int64_t nbytes) {
  if (slot < 0 || slot >= num_slots_) {
    return Status(ErrorCode::kOutOfRange, "slot " + std::to_string(slot) +
                                              " out of range (arena has " +
                                              std::to_string(num_slots_) + " slots)");
  }
  const auto c = static_cast<std::size_t>(slot / slots_per_chunk_);
  if (!chunks_[c].defined()) {
    const std::int64_t rows =
        std::min(slots_per_chunk_, num_slots_ - static_cast<std::int64_t>(c) * slots_per_chunk_);
    try {
      chunks_[c] = at::empty({rows, slot_bytes_}, at::TensorOptions().dtype(at::kByte).pinned_memory(pin_));
    } catch (const c10::Error& e) {
      return Status(ErrorCode::kOutOfMemory,
                    "cannot allocate a host arena chunk of " + std::to_string(rows * slot_bytes_) +
                        " bytes: " + e.what_without_backtrace());
    }
  }
  return chunks_[c][slot % slots_per_chunk_].narrow(0, offset, nbytes);
}

Status HostArena::write(std::int64_t slot, std::int64_t offset, const at::Tensor& data) {
  auto row = view(slot, offset, data.numel());
  if (!row.ok()) return row.status();
  tags_[static_cast<std::size_t>(slot)].reset();
  row.value().copy_(data);
  return Status::Ok();
}

void HostArena::seal(std::int64_t slot, std::string tag) {
  tags_.at(static_cast<std::size_t>(slot)) = std::move(tag);
}

std::optional<std::string> HostArena::tag(std::int64_t slot) const {
  if (slot < 0 || slot >= num_slots_) return std::nullopt;
  return tags_[static_cast<std::size_t>(slot)];
}

std::vector<std::int64_t> HostArena::sealed_slots() const {
  std::vector<std::int64_t> out;
  for (std::int64_t s = 0; s < num_slots_; ++s) {
    if (tags_[static_cast<std::size_t>(s)]) out.push_back(s);
  }
  return out;
}

}  // namespace activekv
