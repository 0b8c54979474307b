// CPUs beside the calling thread (src/cpu_affinity.h): the CPU copy thread's.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include <sched.h>

#include "cpu_affinity.h"

namespace activekv {
namespace {

TEST(CpuAffinity, ParsesTheKernelsCpuLists) {
  EXPECT_EQ(detail::parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(detail::parse_cpu_list("5"), (std::vector<int>{5}));
  EXPECT_EQ(detail::parse_cpu_list("2,0-1,1"), (std::vector<int>{0, 1, 2}));  // sorted, once each
  EXPECT_TRUE(detail::parse_cpu_list("").empty());
  EXPECT_TRUE(detail::parse_cpu_list("0-x").empty());  // not a list: no CPUs known
}

// On a thread bound to one CPU (as vLLM binds its forward's), the CPUs beside
// it are the others it may use; unbound, there are none.
TEST(CpuAffinity, TheCpusBesideABoundThreadAreTheOthers) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "one CPU";
  std::vector<int> all;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(static_cast<std::size_t>(c), &allowed)) all.push_back(c);
  }
  std::vector<int> beside, pinned_to;
  std::thread bound([&] {  // a thread of its own: the test's thread keeps its CPUs
    EXPECT_TRUE(detail::cpus_beside_caller().empty()) << "unbound, the caller may run anywhere";
    beside = detail::pin_caller_to({all.front()});
    beside = detail::cpus_beside_caller();
    pinned_to = detail::pin_caller_to(beside);
  });
  bound.join();
  const std::vector<int> others(all.begin() + 1, all.end());
  // The node files may leave out CPUs on other NUMA nodes; every one is another allowed CPU.
  ASSERT_FALSE(beside.empty());
  for (const int c : beside) EXPECT_NE(std::find(others.begin(), others.end(), c), others.end()) << c;
  EXPECT_EQ(pinned_to, beside);
  EXPECT_TRUE(detail::pin_caller_to({}).empty());  // nothing to run on: refused, the caller unchanged
}

}  // namespace
}  // namespace activekv
