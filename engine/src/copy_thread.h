// A thread of its own for a layer streamer's copies: it issues them on CUDA, makes them on CPU (internal).
//
// Issuing a layer's batch costs the host about 0.5 us a copy, and once the
// copy stream's queue of pending work is full the driver's call blocks until
// the copy engines drain it. On the forward's thread both hold back the
// model's own launches: the next layer's attention is launched late and the
// ring buffer it frees is late for its next occupant's staging. Issued from
// this thread, the copies wait in the driver and the forward does not; but on
// the H200 the forward's launches still queued behind this thread's calls in
// the driver, so it is off by default (StreamingTuning::issue_thread). The
// driver's full queue may be why: in one run with it four times as large
// (CUDA_SCALE_LAUNCH_QUEUES=4x) the thread's step matched the forward's own
// calls (docs/benchmarks/history.md, "The grid back to back on the H200").
//
// Tasks run one at a time, in the order posted, so whatever they issue onto a
// stream lands there in that order.
//
// On CPU the thread makes the copies themselves (StreamingTuning::
// cpu_copy_thread): a layer's copies are posted a layer's compute or more
// before they are waited for, and take microseconds to tens. Waking the
// sleeping thread is then the poster's main cost (about 8 us a wake on this
// project's 2-core VM), so each side wakes the other only when it sleeps, a
// copy not due before the next layer's is posted without a wake (it runs with
// the next one that is), and a waiter spins a while before it sleeps. The
// thread does not spin for its next task: a core spinning beside the forward
// slowed its attention 1.9-2.6x there (docs/benchmarks/history.md, 2026-12-05).
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace activekv::detail {

class CopyThread {
 public:
  // The thread works on `device` (its context current for the driver's calls).
  explicit CopyThread(c10::Device device);
  // Runs what was posted, then joins.
  ~CopyThread();
  CopyThread(const CopyThread&) = delete;
  CopyThread& operator=(const CopyThread&) = delete;

  // Queues `task`; returns its number (1, 2, ...), for wait_for. `wake`
  // false leaves a sleeping thread asleep: the task runs once a later post
  // or a wait_for wakes it (a CPU copy not yet due, copy_thread.h).
  std::uint64_t post(std::function<void()> task, bool wake = true);
  // Waits until task `n` and every task before it ran. Rethrows, once, the
  // first exception a task threw; the tasks queued behind it are dropped (the
  // state they would work on is the failed one's).
  void wait_for(std::uint64_t n);
  // wait_for the last task posted.
  void drain();

 private:
  void run(c10::Device device);

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> tasks_;
  std::uint64_t posted_ = 0;
  std::uint64_t done_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
  bool idle_ = false;          // the thread sleeps, waiting for a task
  std::uint64_t waiters_ = 0;  // callers asleep in wait_for
  // Copies of done_ and of whether error_ is set, for wait_for's spin, which
  // does not take the lock.
  std::atomic<std::uint64_t> done_now_{0};
  std::atomic<bool> failed_now_{false};
  std::thread thread_;  // last: starts once the rest is set up
};

}  // namespace activekv::detail
