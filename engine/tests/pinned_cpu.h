// One CPU for the calling thread, as vLLM binds its forward's OpenMP threads,
// for the CPU copy thread's tests (src/cpu_affinity.h).
#pragma once

#include <ATen/Parallel.h>

#include <cstddef>

#include <sched.h>

namespace activekv::test {

// The forward as one thread on one CPU, as vLLM binds its forward's OpenMP
// threads (here ATen's pool is the calling thread alone), until this goes (its
// CPUs and ATen's threads are restored then).
class PinnedToOneCpu {
 public:
  PinnedToOneCpu() : threads_(at::get_num_threads()) {
    at::set_num_threads(1);
    CPU_ZERO(&before_);
    if (sched_getaffinity(0, sizeof(before_), &before_) != 0 || CPU_COUNT(&before_) < 2) return;
    while (!CPU_ISSET(static_cast<std::size_t>(cpu_), &before_)) ++cpu_;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(static_cast<std::size_t>(cpu_), &one);
    pinned_ = sched_setaffinity(0, sizeof(one), &one) == 0;
  }
  ~PinnedToOneCpu() {
    if (pinned_) sched_setaffinity(0, sizeof(before_), &before_);
    at::set_num_threads(threads_);
  }
  PinnedToOneCpu(const PinnedToOneCpu&) = delete;
  PinnedToOneCpu& operator=(const PinnedToOneCpu&) = delete;
  bool pinned() const { return pinned_; }
  int cpu() const { return cpu_; }

 private:
  int threads_;
  cpu_set_t before_;
  int cpu_ = 0;
  bool pinned_ = false;
};

}  // namespace activekv::test
