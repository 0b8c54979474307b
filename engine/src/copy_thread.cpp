// A thread of its own for a layer streamer's copy issuing (copy_thread.h).
#include "copy_thread.h"

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

// How long a caller looks for its task's end before it sleeps: a layer's copy
// on a CPU (14 us at 3776 tokens of the tiny Llama).
constexpr auto kWaitSpin = std::chrono::microseconds(50);

// Checks `ready()` without sleeping until it is true or `spin` has passed.
template <class Ready>
void spin_until(Ready ready, std::chrono::microseconds spin) {
  const auto until = std::chrono::steady_clock::now() + spin;
  while (!ready() && std::chrono::steady_clock::now() < until) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

}  // namespace

CopyThread::CopyThread(c10::Device device) : thread_([this, device] { run(device); }) {}

CopyThread::~CopyThread() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

std::uint64_t CopyThread::post(std::function<void()> task, bool wake) {
  std::uint64_t n = 0;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    n = ++posted_;
    wake = wake && idle_;  // set under the lock before the thread sleeps: no wake-up is lost
  }
  if (wake) changed_.notify_all();
  return n;
}

void CopyThread::wait_for(std::uint64_t n) {
  if (done_now_ < n && !failed_now_) {
    bool wake = false;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      wake = idle_ && !tasks_.empty();  // posted without a wake
    }
    if (wake) changed_.notify_all();
    spin_until([&] { return done_now_ >= n || failed_now_; }, kWaitSpin);
  }
  std::unique_lock<std::mutex> lock(mu_);
  const auto done = [&] { return done_ >= n || error_ != nullptr; };
  if (!done()) {
    ++waiters_;
    wait_until_done(changed_, lock, done);
    --waiters_;
  }
  if (error_ != nullptr) {
    // Whatever was queued behind the failed task is dropped with it.
    done_ += tasks_.size();
    done_now_ = done_;
    tasks_.clear();
    failed_now_ = false;
    std::rethrow_exception(std::exchange(error_, nullptr));
  }
}

void CopyThread::drain() {
  std::uint64_t last = 0;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    last = posted_;
  }
  wait_for(last);
}

void CopyThread::run(c10::Device device) {
  c10::impl::VirtualGuardImpl(device.type()).setDevice(device);
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto ready = [&] { return stopping_ || (!tasks_.empty() && error_ == nullptr); };
      if (!ready()) {
        idle_ = true;
        wait_until_done(changed_, lock, ready);
        idle_ = false;
      }
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
    bool wake = false;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      ++done_;
      done_now_ = done_;
      if (failed != nullptr) {
        error_ = failed;
        failed_now_ = true;
      }
      wake = waiters_ > 0;
    }
    if (wake) changed_.notify_all();
  }
}

}  // namespace activekv::detail
