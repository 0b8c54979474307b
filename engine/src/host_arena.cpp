#include "activekv/host_arena.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

namespace activekv {

HostArena::HostArena(std::int64_t num_slots, std::int64_t num_layers, std::int64_t layer_bytes, bool pin,
                     std::int64_t chunk_bytes)
    : num_slots_(num_slots),
      num_layers_(num_layers),
      layer_bytes_(layer_bytes),
      pin_(pin),
      slots_per_chunk_(std::max<std::int64_t>(1, chunk_bytes / (num_layers * layer_bytes))),
      chunks_(static_cast<std::size_t>((num_slots + slots_per_chunk_ - 1) / slots_per_chunk_)),
      tags_(static_cast<std::size_t>(num_slots)),
      generations_(static_cast<std::size_t>(num_slots), 0),
      quarantined_(static_cast<std::size_t>(num_slots), 0) {}

HostArena::HostArena(std::int64_t num_layers, std::int64_t layer_bytes, std::shared_ptr<StoreFile> file)
    : HostArena(file->num_slots(), num_layers, layer_bytes, /*pin=*/false,
                file->slots_per_chunk() * num_layers * layer_bytes) {
  if (file->num_layers() != num_layers || file->layer_bytes() != layer_bytes ||
      file->slots_per_chunk() != slots_per_chunk_) {
    throw std::invalid_argument("the store file holds " + std::to_string(file->num_layers()) + " layers of " +
                                std::to_string(file->layer_bytes()) + " bytes in chunks of " +
                                std::to_string(file->slots_per_chunk()) + " slots, not the arena's " +
                                std::to_string(num_layers) + " of " + std::to_string(layer_bytes));
  }
  file_ = std::move(file);  // from here on the file's records are the tags: other processes seal there too
}

SlotLease HostArena::lease(const std::vector<std::int64_t>& slots) {
  SlotLease out;
  out.slots = slots;
  out.generations.reserve(slots.size());
  for (const auto slot : slots) {
    if (quarantined(slot)) {
      throw std::logic_error("slot " + std::to_string(slot) + " is quarantined and cannot be leased");
    }
    tags_[static_cast<std::size_t>(slot)].clear();  // keeps its buffer for the next seal
    out.generations.push_back(++generations_[static_cast<std::size_t>(slot)]);
    if (file_) file_->begin_write(slot);  // not served after a crash from here on
  }
  return out;
}

Status HostArena::seal(const SlotLease& lease, const std::vector<std::string>& tags) {
  if (tags.size() != lease.slots.size()) {
    throw std::invalid_argument("seal: " + std::to_string(tags.size()) + " tags for " +
                                std::to_string(lease.slots.size()) + " slots");
  }
  for (std::size_t i = 0; i < lease.slots.size(); ++i) {
    if (tags[i].empty()) {
      throw std::invalid_argument("seal: an empty tag for slot " + std::to_string(lease.slots[i]));
    }
    if (file_ && tags[i].size() != std::tuple_size_v<StoreTag>) {
      throw std::invalid_argument("seal: a store file's tag is " +
                                  std::to_string(std::tuple_size_v<StoreTag>) + " bytes, not " +
                                  std::to_string(tags[i].size()));
    }
    const auto slot = lease.slots[i];
    if (generations_[static_cast<std::size_t>(slot)] != lease.generations[i]) {
      return {ErrorCode::kStale, "slot " + std::to_string(slot) + " was leased at generation " +
                                     std::to_string(lease.generations[i]) + " but is now at " +
                                     std::to_string(generations_[static_cast<std::size_t>(slot)])};
    }
  }
  for (std::size_t i = 0; i < lease.slots.size(); ++i) {
    if (file_) {
      StoreTag t{};
      std::copy(tags[i].begin(), tags[i].end(), t.begin());
      file_->commit(lease.slots[i], t);
    } else {
      tags_[static_cast<std::size_t>(lease.slots[i])] = tags[i];
    }
  }
  return Status::Ok();
}

void HostArena::quarantine(const SlotLease& lease) {
  for (const auto slot : lease.slots) {
    const auto i = static_cast<std::size_t>(slot);
    tags_[i].clear();
    ++generations_[i];
    if (!quarantined_[i]) ++quarantined_count_;
    quarantined_[i] = 1;
  }
}

std::int64_t HostArena::allocated_chunks() const {
  return std::count_if(chunks_.begin(), chunks_.end(), [](const auto& c) { return c.defined(); });
}

std::vector<SlotRun> HostArena::runs(const std::vector<std::int64_t>& slots) const {
  std::vector<SlotRun> out;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const auto s = slots[i];
    if (!out.empty()) {
      SlotRun& last = out.back();
      if (s == last.first + last.count && s / slots_per_chunk_ == last.first / slots_per_chunk_) {
        ++last.count;
        continue;
      }
    }
    out.push_back(SlotRun{s, 1, static_cast<std::int64_t>(i)});
  }
  return out;
}

std::vector<SlotRun> HostArena::all_runs() const {
  std::vector<SlotRun> out;
  for (std::int64_t first = 0; first < num_slots_; first += slots_per_chunk_) {
    out.push_back(SlotRun{first, std::min(slots_per_chunk_, num_slots_ - first), first});
  }
  return out;
}

Status HostArena::allocate_all() {
  for (std::int64_t c = 0; c < num_chunks(); ++c) {
    if (const Status s = ensure_chunk(c); !s.ok()) return s;
  }
  return Status::Ok();
}

Status HostArena::ensure_chunk(std::int64_t chunk) {
  auto& c = chunks_[static_cast<std::size_t>(chunk)];
  if (c.defined()) return Status::Ok();
  const std::int64_t rows = std::min(slots_per_chunk_, num_slots_ - chunk * slots_per_chunk_);
  if (file_) {  // the file outlives its views: the arena holds it
    c = at::from_blob(file_->chunk_data(chunk), {num_layers_, rows, layer_bytes_},
                      at::TensorOptions().dtype(at::kByte));
    return Status::Ok();
  }
  try {
    c = at::empty({num_layers_, rows, layer_bytes_},
                  at::TensorOptions().dtype(at::kByte).pinned_memory(pin_));
  } catch (const c10::Error& e) {
    return {ErrorCode::kOutOfMemory, "cannot allocate a host arena chunk of " +
                                         std::to_string(num_layers_ * rows * layer_bytes_) +
                                         " bytes: " + e.what_without_backtrace()};
  }
  return Status::Ok();
}

Result<at::Tensor> HostArena::run_view(std::int64_t layer, const SlotRun& run) {
  if (run.first < 0 || run.count < 1 || run.first + run.count > num_slots_ ||
      run.first / slots_per_chunk_ != (run.first + run.count - 1) / slots_per_chunk_) {
    return Status(ErrorCode::kOutOfRange,
                  "slots " + std::to_string(run.first) + ".." + std::to_string(run.first + run.count - 1) +
                      " out of range (arena has " + std::to_string(num_slots_) + " slots)");
  }
  const std::int64_t chunk = run.first / slots_per_chunk_;
  if (const Status s = ensure_chunk(chunk); !s.ok()) return s;
  return chunks_[static_cast<std::size_t>(chunk)][layer].narrow(0, run.first % slots_per_chunk_, run.count);
}

Result<at::Tensor> HostArena::chunk_view(std::int64_t layer, std::int64_t chunk) {
  if (chunk < 0 || chunk >= num_chunks()) {
    return Status(ErrorCode::kOutOfRange, "chunk " + std::to_string(chunk) + " out of range (arena has " +
                                              std::to_string(num_chunks()) + " chunks)");
  }
  if (const Status s = ensure_chunk(chunk); !s.ok()) return s;
  return chunks_[static_cast<std::size_t>(chunk)][layer];
}

std::optional<std::string> HostArena::tag(std::int64_t slot) const {
  if (slot < 0 || slot >= num_slots_) return std::nullopt;
  if (file_) {
    if (quarantined(slot)) return std::nullopt;  // this process's copies into it may still land
    const auto t = file_->sealed_tag(slot);
    return t ? std::optional<std::string>(std::string(t->begin(), t->end())) : std::nullopt;
  }
  const std::string& t = tags_[static_cast<std::size_t>(slot)];
  return t.empty() ? std::nullopt : std::optional<std::string>(t);
}

bool HostArena::holds(std::int64_t slot, const std::string& tag) const {
  if (tag.empty()) return false;
  if (file_) return tag == this->tag(slot);
  return slot >= 0 && slot < num_slots_ && tags_[static_cast<std::size_t>(slot)] == tag;
}

std::vector<std::int64_t> HostArena::sealed_slots() const {
  std::vector<std::int64_t> out;
  for (std::int64_t s = 0; s < num_slots_; ++s) {
    if (tag(s)) out.push_back(s);
  }
  return out;
}

Result<std::string> HostArena::slot_data(std::int64_t slot) {
  std::string out;
  for (std::int64_t l = 0; l < num_layers_; ++l) {
    auto v = run_view(l, SlotRun{slot, 1, 0});
    if (!v.ok()) return v.status();
    const at::Tensor bytes = v.value().contiguous();
    out.append(reinterpret_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel()));
  }
  return out;
}

}  // namespace activekv
