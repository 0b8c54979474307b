// The CPU target's ring copies (internal; ring_copies.h): memcpy runs between
// the homes and the ring (ATen for compressed homes), on the forward's thread
// in wait_for_layer_load's and save_kv_layer's calls, or beside a bound
// forward on a copy thread pinned to CPUs the forward does not use
// (StreamingTuning::cpu_copy_thread, for a step staging enough). The thread
// plays a copy stream's part, in post order: start posts the first K
// stagings, stage_ahead posts layer j's write-back with layer j + K's staging
// as one task, and stage waits for the layer's staging and its buffer's last
// occupant's write-back; end_step waits for the last step's.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "activekv/step_runs.h"
#include "ring_copies.h"

namespace activekv::detail {

class CpuRingCopies final : public RingCopies {
 public:
  // `workers`: how many of vLLM's workers share this host's CPUs; beside a
  // second one no copy thread is started (the forward's neighbouring cores
  // may be another worker's forward).
  CpuRingCopies(StreamedRing& ring, std::int64_t workers);
  ~CpuRingCopies() override;

  void end_step() override;
  void plan_step() override;
  void start(Telemetry& stats) override;
  void stage(std::int64_t streamed, Telemetry& stats) override;
  void write_back(std::int64_t streamed, Telemetry& stats) override;
  void stage_ahead(std::int64_t streamed, std::optional<c10::Event> gathered, Telemetry& stats) override;
  void synchronize() override { drain(); }
  bool can_copy_by(StreamCopy method) const override { return method == StreamCopy::kRuns; }
  void set_copy_method(StreamCopy method) override;
  void set_tuning(const StreamingTuning& tuning) override;
  const std::vector<int>& copy_thread_cpus() const override { return copy_thread_cpus_; }

 private:
  // A step's runs of consecutive home rows (inside a chunk), each cut where
  // its block ids stop being consecutive (pair_runs, step_runs.h). Exact
  // homes: a memcpy per piece (a copy_ pays ATen's dispatch each call,
  // index_copy_ moves elements: both ran at 2-5 GB/s a block at a time).
  // Compressed homes: one slice of the ring where the run is one piece, else
  // the codec's batch by index.
  struct HomeRun {
    SlotRun rows;
    std::vector<PairRun> pieces;
    std::optional<at::Tensor> ids;  // the blocks for an index copy (compressed homes)
  };
  std::vector<HomeRun> home_runs(const std::vector<std::int64_t>& blocks,
                                 const std::vector<std::int64_t>& rows) const;
  // Between a run's home rows and its blocks in the ring, either way.
  void copy_run(std::int64_t streamed, const HomeRun& run, bool to_home);
  // A layer's staging and write-back, on the calling thread.
  void stage_now(std::int64_t streamed);
  void write_back_now(std::int64_t streamed);
  // Compressed homes: the step's fresh blocks as zeros in the buffer.
  void zero_fresh(std::int64_t streamed);
  void apply_copy_thread();  // starts or stops it as tuning_ says
  // Posts the write-back write_back left, then waits for every task.
  void drain();
  // Posts, as one task, the write-back of streamed layer `written` and the
  // staging of streamed layer `staged` (-1: none; a staging only where one is
  // due and not yet posted, counted in `stats`). `due`: stage() waits for it
  // next (the thread is woken for it).
  void post_copies(std::int64_t written, std::int64_t staged, Telemetry* stats, bool due);
  bool posts_stage(std::int64_t streamed) const;
  // Posts the write-back write_back left for stage_ahead, if any.
  void post_written_back();
  // Moves the copy thread's time so far into the caller's counters.
  void take_copy_thread_time(Telemetry& stats);

  std::vector<int> copy_thread_cpus_;
  // Per step: the copies run on the copy thread (a step staging enough).
  bool on_thread_ = false;
  std::vector<HomeRun> stage_runs_, writeback_runs_;
  // The copy thread's time, not yet in a Telemetry: the next stage or
  // write_back counts it, so a step's last copies count in the next step.
  std::atomic<std::int64_t> copy_thread_us_{0};
  std::int64_t written_back_ = -1;  // the write-back not yet posted
  // Per step: the streamed layer stage() is called for next, and the first
  // whose staging was posted without waking the thread (-1: none).
  std::int64_t next_stage_ = 0;
  std::int64_t not_woken_for_ = -1;
  std::optional<at::Tensor> fresh_ids_;  // per step, made on first use
};

}  // namespace activekv::detail
