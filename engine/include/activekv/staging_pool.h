// Staging regions for host<->device transfers, handed out as leases.
//
// A lease names a region and the region's generation when it was handed out.
// It goes back to the pool only through release(), after the transfer's fence
// completed; a stale lease (older generation) is a broken contract. A fence
// whose outcome is unknown (error, timeout) quarantines its region: it is
// never reused, so a late DMA can never land in memory someone else owns.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "activekv/status.h"

namespace activekv {

struct StagingLease {
  std::int64_t region = -1;
  std::uint64_t generation = 0;
  at::Tensor buffer;  // [bytes] uint8, a view of the region
};

class StagingPool {
 public:
  explicit StagingPool(bool pin) : pin_(pin) {}
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A region of at least `bytes`; reuses a free one or allocates (kOutOfMemory).
  Result<StagingLease> acquire(std::int64_t bytes);
  // The lease's fence completed: the region may be handed out again.
  void release(const StagingLease& lease);
  // The lease's fence has an unknown outcome: never reuse the region.
  void quarantine(const StagingLease& lease);

  std::int64_t quarantined() const { return quarantined_; }
  std::int64_t in_use() const;
  std::int64_t regions() const { return static_cast<std::int64_t>(regions_.size()); }

 private:
  enum class State { kFree, kLeased, kQuarantined };
  struct Region {
    at::Tensor memory;
    std::uint64_t generation = 0;
    State state = State::kFree;
  };
  Region& leased(const StagingLease& lease);

  bool pin_;
  std::vector<Region> regions_;
  std::int64_t quarantined_ = 0;
};

}  // namespace activekv
