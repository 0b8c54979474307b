// What the scheduler side's tests share: the block size, the id lists and
// the requests vLLM announces.
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

#include "activekv/scheduler_side.h"

namespace activekv::scheduler_testing {

constexpr std::int64_t kBlockSize = 4;
using Ids = std::vector<std::int64_t>;
using New = SchedulerSide::NewRequest;
using Cached = SchedulerSide::CachedRequest;

// `n` consecutive token ids from `first`.
inline Ids tokens(std::int64_t n, std::int64_t first = 100) {
  Ids out(static_cast<std::size_t>(n));
  std::iota(out.begin(), out.end(), first);
  return out;
}

}  // namespace activekv::scheduler_testing
