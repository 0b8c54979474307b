// CPUs beside the calling thread (src/cpu_affinity.h): the CPU copy thread's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cpu_affinity.h"
#include "pinned_cpu.h"

namespace activekv {
namespace {

TEST(CpuAffinity, ParsesTheKernelsCpuLists) {
  EXPECT_EQ(detail::parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(detail::parse_cpu_list("5"), (std::vector<int>{5}));
  EXPECT_EQ(detail::parse_cpu_list("2,0-1,1"), (std::vector<int>{0, 1, 2}));  // sorted, once each
  EXPECT_TRUE(detail::parse_cpu_list("").empty());
  EXPECT_TRUE(detail::parse_cpu_list("0-x").empty());  // not a list: no CPUs known
}

std::vector<int> allowed_cpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  EXPECT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  std::vector<int> all;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(static_cast<std::size_t>(c), &allowed)) all.push_back(c);
  }
  return all;
}

// Beside a forward bound to one CPU (as vLLM binds its forward's) are the
// others the process may use; beside one that may run anywhere, none.
TEST(CpuAffinity, TheCpusBesideABoundForwardAreTheOthers) {
  const std::vector<int> all = allowed_cpus();
  if (all.size() < 2) GTEST_SKIP() << "one CPU";
  EXPECT_TRUE(detail::cpus_beside(all).empty()) << "unbound, the forward may run anywhere";
  const std::vector<int> beside = detail::cpus_beside({all.front()});
  // The node files may leave out CPUs on other NUMA nodes, and a sibling of
  // CPU 0 is left out; every one is another allowed CPU.
  ASSERT_FALSE(beside.empty());
  for (const int c : beside) {
    EXPECT_NE(c, all.front());
    EXPECT_TRUE(std::binary_search(all.begin(), all.end(), c)) << c;
  }
  std::vector<int> pinned_to;
  std::thread copier([&] { pinned_to = detail::pin_caller_to(beside); });  // the test's thread keeps its CPUs
  copier.join();
  EXPECT_EQ(pinned_to, beside);
  EXPECT_TRUE(detail::pin_caller_to({}).empty());  // nothing to run on: refused, the caller unchanged
}

// Whether a child process, its forward bound to `forward`, finds CPUs beside
// it (vllm serve's worker is a child of the process it was started from).
bool child_finds_cpus_beside(int forward) {
  const pid_t child = fork();
  if (child == 0) _exit(detail::cpus_beside({forward}).empty() ? 1 : 0);
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status));
  return WEXITSTATUS(status) == 0;
}

// A worker whose parent was started under taskset (or numactl -C) stays
// within it: the CPUs its own bound forward leaves may be another process's.
TEST(CpuAffinity, NoCpuBesideTheForwardOutsideTheParentsAffinity) {
  const std::vector<int> all = allowed_cpus();
  if (all.size() < 2) GTEST_SKIP() << "one CPU";
  if (detail::cpus_beside({all.front()}).empty()) GTEST_SKIP() << "no CPU beside the first on its node";
  EXPECT_TRUE(child_finds_cpus_beside(all.front())) << "a parent that may run anywhere";
  const test::PinnedToOneCpu confined;  // this process as its parent: the first CPU alone
  ASSERT_TRUE(confined.pinned());
  EXPECT_FALSE(child_finds_cpus_beside(all.front())) << "a parent confined to the forward's CPU";
}

// The forward is every thread of the process but a copy thread: with each
// bound to a CPU of its own (vLLM's way with Intel's or GNU's OpenMP
// preloaded), the calling thread's CPU alone is not the forward's.
TEST(CpuAffinity, TheForwardsCpusAreEveryThreadsButACopyThreads) {
  const std::vector<int> all = allowed_cpus();
  const test::PinnedToOneCpu pinned;  // this thread: the forward's first, on the first allowed CPU
  if (!pinned.pinned()) GTEST_SKIP() << "one CPU";
  const std::vector<int> alone = detail::forward_cpus();
  std::mutex mu;
  std::condition_variable changed;
  int stage = 0;  // 1: the thread beside is pinned; 2: it may go
  // forward_cpus while a thread pinned to the second CPU lives beside this one.
  const auto seen_beside = [&](bool copy_thread) {
    std::thread beside([&] {
      if (copy_thread) {
        detail::pin_caller_to({all[1]});  // named as the copy thread
      } else {
        cpu_set_t second;
        CPU_ZERO(&second);
        CPU_SET(static_cast<std::size_t>(all[1]), &second);
        sched_setaffinity(0, sizeof(second), &second);
      }
      std::unique_lock<std::mutex> lock(mu);
      stage = 1;
      changed.notify_all();
      changed.wait(lock, [&] { return stage == 2; });
    });
    {
      std::unique_lock<std::mutex> lock(mu);
      changed.wait(lock, [&] { return stage == 1; });
    }
    const std::vector<int> seen = detail::forward_cpus();
    {
      const std::lock_guard<std::mutex> lock(mu);
      stage = 2;
    }
    changed.notify_all();
    beside.join();
    stage = 0;
    return seen;
  };
  const std::vector<int> with_copy_thread = seen_beside(true);
  const std::vector<int> with_forward_thread = seen_beside(false);
  if (alone != std::vector<int>{all[0]}) GTEST_SKIP() << "other threads of this process run anywhere";
  EXPECT_EQ(with_copy_thread, std::vector<int>{all[0]});
  EXPECT_EQ(with_forward_thread, (std::vector<int>{all[0], all[1]}));
}

}  // namespace
}  // namespace activekv
