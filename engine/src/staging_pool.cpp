#include "activekv/staging_pool.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace activekv {

Result<StagingLease> StagingPool::acquire(std::int64_t bytes) {
  std::int64_t pick = -1;
  for (std::size_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i].state == State::kFree && regions_[i].memory.numel() >= bytes) {
      pick = static_cast<std::int64_t>(i);
      break;
    }
  }
  if (pick < 0) {
    Region region;
    try {
      region.memory = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(pin_));
    } catch (const c10::Error& e) {
      return Status(ErrorCode::kOutOfMemory, "cannot allocate a staging region of " +
                                                 std::to_string(bytes) +
                                                 " bytes: " + e.what_without_backtrace());
    }
    regions_.push_back(std::move(region));
    pick = static_cast<std::int64_t>(regions_.size()) - 1;
  }
  Region& r = regions_[static_cast<std::size_t>(pick)];
  r.state = State::kLeased;
  ++r.generation;
  return StagingLease{pick, r.generation, r.memory.narrow(0, 0, bytes)};
}

StagingPool::Region& StagingPool::leased(const StagingLease& lease) {
  if (lease.region < 0 || lease.region >= regions()) {
    throw std::logic_error("staging lease of an unknown region");
  }
  Region& r = regions_[static_cast<std::size_t>(lease.region)];
  if (r.state != State::kLeased || r.generation != lease.generation) {
    throw std::logic_error("stale staging lease (region " + std::to_string(lease.region) +
                           ", generation " + std::to_string(lease.generation) + ")");
  }
  return r;
}

void StagingPool::release(const StagingLease& lease) { leased(lease).state = State::kFree; }

void StagingPool::quarantine(const StagingLease& lease) {
  leased(lease).state = State::kQuarantined;
  ++quarantined_;
}

std::int64_t StagingPool::in_use() const {
  return std::count_if(regions_.begin(), regions_.end(),
                       [](const Region& r) { return r.state == State::kLeased; });
}

}  // namespace activekv
