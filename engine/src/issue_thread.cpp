// A thread of its own for a layer streamer's copy issuing (issue_thread.h).
#include "issue_thread.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <utility>

namespace activekv::detail {
namespace {

// Waits until `done()`. condition_variable::wait(lock) is a libstdc++ symbol
// of GCC 12 (GLIBCXX_3.4.30), past what a manylinux_2_34 wheel may use
// (auditwheel refuses it); the timed wait is inline.
template <class Done>
void wait_until_done(std::condition_variable& changed, std::unique_lock<std::mutex>& lock, Done done) {
  while (!changed.wait_for(lock, std::chrono::seconds(1), done)) {
  }
}

}  // namespace

IssueThread::IssueThread(c10::Device device) : thread_([this, device] { run(device); }) {}

IssueThread::~IssueThread() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

std::uint64_t IssueThread::post(std::function<void()> task) {
  std::uint64_t n = 0;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    n = ++posted_;
  }
  changed_.notify_all();
  return n;
}

void IssueThread::wait_for(std::uint64_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_until_done(changed_, lock, [&] { return done_ >= n || error_ != nullptr; });
  if (error_ != nullptr) {
    // Whatever was queued behind the failed task is dropped with it.
    done_ += tasks_.size();
    tasks_.clear();
    std::rethrow_exception(std::exchange(error_, nullptr));
  }
}

void IssueThread::drain() {
  std::uint64_t last = 0;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    last = posted_;
  }
  wait_for(last);
}

void IssueThread::run(c10::Device device) {
  c10::impl::VirtualGuardImpl(device.type()).setDevice(device);
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wait_until_done(changed_, lock, [&] { return stopping_ || (!tasks_.empty() && error_ == nullptr); });
      if (tasks_.empty() || error_ != nullptr) return;  // stopping, and nothing left to run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::exception_ptr failed;
    try {
      task();
    } catch (...) {
      failed = std::current_exception();
    }
    {
      const std::lock_guard<std::mutex> lock(mu_);
      ++done_;
      if (failed != nullptr) error_ = failed;
    }
    changed_.notify_all();
  }
}

}  // namespace activekv::detail
