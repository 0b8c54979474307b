// The layer streamer's copy thread (src/copy_thread.h): tasks run in the
// order posted, off the caller's thread; wait_for returns once a task ran;
// a task's exception reaches the caller once, with the tasks behind it dropped.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "copy_thread.h"

namespace activekv {
namespace {

const c10::Device kCpu{c10::DeviceType::CPU};

TEST(CopyThread, RunsTasksInOrderOffTheCallersThread) {
  detail::CopyThread issuer(kCpu);
  std::vector<int> ran;  // written only by the copy thread, read after wait_for
  std::thread::id where;
  std::uint64_t last = 0;
  for (int i = 0; i < 200; ++i) {
    last = issuer.post([&ran, &where, i] {
      ran.push_back(i);
      where = std::this_thread::get_id();
    });
  }
  issuer.wait_for(last);
  ASSERT_EQ(ran.size(), 200U);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(ran[static_cast<std::size_t>(i)], i);
  EXPECT_NE(where, std::this_thread::get_id());
}

TEST(CopyThread, WaitForReturnsOnceThatTaskRanNotBefore) {
  detail::CopyThread issuer(kCpu);
  std::atomic<bool> release{false};
  std::atomic<int> done{0};
  const auto slow = issuer.post([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ++done;
  });
  const auto after = issuer.post([&] { ++done; });
  EXPECT_EQ(slow + 1, after);
  std::thread waiter([&] { issuer.wait_for(slow); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(done.load(), 0);  // the slow task holds both
  release = true;
  waiter.join();
  EXPECT_GE(done.load(), 1);
  issuer.drain();
  EXPECT_EQ(done.load(), 2);
}

TEST(CopyThread, RethrowsATasksErrorOnceAndDropsTheTasksBehindIt) {
  detail::CopyThread issuer(kCpu);
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  issuer.post([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    throw std::runtime_error("cuMemcpyBatchAsync failed");
  });
  const auto behind = issuer.post([&] { ++ran; });  // queued before the failure is known
  release = true;
  try {
    issuer.wait_for(behind);
    FAIL() << "wait_for returned past a failed task";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "cuMemcpyBatchAsync failed");
  }
  EXPECT_EQ(ran.load(), 0);
  // Taken once: the thread serves the next tasks.
  const auto next = issuer.post([&] { ++ran; });
  issuer.wait_for(next);
  EXPECT_EQ(ran.load(), 1);
  EXPECT_NO_THROW(issuer.drain());
}

// A task posted without a wake (a CPU copy not yet due) waits for a later
// post that wakes the thread, or for a caller's wait_for, which wakes it.
TEST(CopyThread, ATaskPostedWithoutAWakeRunsOnceWaitedForOrWokenFor) {
  detail::CopyThread issuer(kCpu);
  std::atomic<int> ran{0};
  issuer.drain();  // the thread is up
  // Unwoken, the thread would still look at its queue once a second: each
  // wait must end well before that.
  const auto timed_wait = [&](std::uint64_t task) {
    const auto t0 = std::chrono::steady_clock::now();
    issuer.wait_for(task);
    return std::chrono::steady_clock::now() - t0;
  };
  for (int round = 0; round < 20; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // asleep by now
    const auto lazy = issuer.post([&] { ++ran; }, /*wake=*/false);
    ASSERT_LT(timed_wait(lazy), std::chrono::milliseconds(300)) << "round " << round;
    ASSERT_EQ(ran.load(), 2 * round + 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    issuer.post([&] { ++ran; }, /*wake=*/false);
    ASSERT_LT(timed_wait(issuer.post([&] { ++ran; })), std::chrono::milliseconds(300)) << "round " << round;
    ASSERT_EQ(ran.load(), 2 * round + 3);  // woken for the second, it ran both
    ran -= 1;
  }
}

TEST(CopyThread, DestructionRunsWhatWasPosted) {
  std::atomic<int> ran{0};
  {
    detail::CopyThread issuer(kCpu);
    for (int i = 0; i < 50; ++i) issuer.post([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace activekv
