// How a ring's blocks cross between their homes and the ring buffers, one
// copier per medium behind one interface (internal; layer_streaming.h has the
// contract of each call): CpuRingCopies (cpu_ring_copies.h: on the forward's
// thread, or on a copy thread of their own) and DeviceRingCopies
// (device_ring_copies.h: on a device's copy streams, by runs, the device
// gather or the copy engines' batch). LayerStreamer chooses one at creation by
// the ring's device and sends each of the step's calls to it.
#pragma once

#include <c10/core/Event.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "activekv/layer_streaming.h"
#include "activekv/streaming_tuning.h"
#include "activekv/telemetry.h"
#include "copy_thread.h"
#include "streamed_ring.h"

namespace activekv::detail {

// Whether the environment sets `name` to `value` (an operator's switches).
bool env_says(const char* name, std::string_view value);

class RingCopies {
 public:
  virtual ~RingCopies();
  RingCopies(const RingCopies&) = delete;
  RingCopies& operator=(const RingCopies&) = delete;

  // begin_step's two halves: end_step before the step's blocks change (what
  // the copies in flight read of them is done with; a device settles the
  // write-backs it may), plan_step after (the step's copies as this copier
  // takes them).
  virtual void end_step() = 0;
  virtual void plan_step() = 0;
  // LayerStreamer's per-layer calls, for a streamed layer's index.
  virtual void start(Telemetry& stats) = 0;
  virtual void stage(std::int64_t streamed, Telemetry& stats) = 0;
  virtual void write_back(std::int64_t streamed, Telemetry& stats) = 0;
  virtual void stage_ahead(std::int64_t streamed, std::optional<c10::Event> gathered, Telemetry& stats) = 0;
  // Every copy landed, every write-back's outcome known.
  virtual void synchronize() = 0;

  StreamCopy copy_method() const { return method_; }
  virtual bool can_copy_by(StreamCopy method) const = 0;
  // std::invalid_argument where !can_copy_by(method); between steps.
  virtual void set_copy_method(StreamCopy method) = 0;
  const StreamingTuning& tuning() const { return tuning_; }
  // Between steps, after synchronize; checked by the caller.
  virtual void set_tuning(const StreamingTuning& tuning) = 0;
  // CPU: the CPUs of the copy thread (empty: copies on the forward's thread).
  virtual const std::vector<int>& copy_thread_cpus() const;
  // CUDA compressed homes: the fused codec kernels, or why there are none.
  virtual bool has_fused_codec() const { return false; }
  virtual const std::string& fused_codec_missing() const;

 protected:
  explicit RingCopies(StreamedRing& ring);

  // Runs `task` now, or posts it to the copy thread where there is one;
  // returns the number to wait_issued for (0: it ran).
  std::uint64_t issue(std::function<void()> task, bool wake = true);
  // Waits until `task` ran on the copy thread; rethrows what it threw.
  void wait_issued(std::uint64_t task);
  // Waits for every task posted.
  void drain_thread();
  // Drains the copy thread, then puts `thread` in its place (nullptr: none).
  void replace_thread(std::unique_ptr<CopyThread> thread);
  // Joins the copy thread: each copier's destructor, before the state its
  // tasks use goes.
  void stop_thread() { copy_thread_.reset(); }
  bool has_thread() const { return copy_thread_ != nullptr; }
  // std::invalid_argument naming what `method` needs, where !can_copy_by(method).
  void check_can_copy_by(StreamCopy method) const;
  // Marks streamed layer `streamed`'s staging issued this step and counts its bytes.
  void note_stage_issued(std::int64_t streamed, Telemetry& stats);
  // Per step: nothing issued yet.
  void clear_step_tasks();

  StreamedRing& ring_;
  StreamingTuning tuning_;
  StreamCopy method_ = StreamCopy::kRuns;
  // Per streamed layer and step: its staging issued (or posted); the task
  // issuing it; the task issuing its ring buffer's last occupant's write-back.
  std::vector<char> stage_issued_;
  std::vector<std::uint64_t> stage_tasks_;
  std::vector<std::uint64_t> occupant_writeback_tasks_;

 private:
  // CUDA with tuning_.issue_thread, or CPU with tuning_.cpu_copy_thread
  // (copy_thread.h).
  std::unique_ptr<CopyThread> copy_thread_;
};

}  // namespace activekv::detail
