// LayerStreamer's copies on the CPU target (layer_streaming.h): memcpy runs
// between the homes and the ring (ATen for compressed homes), on the
// forward's thread or on a copy thread pinned to CPUs the forward does not
// use; the same thread issues a CUDA device's copies when issue_thread is on.
#include "activekv/layer_streaming.h"

#include "copy_thread.h"
#include "cpu_affinity.h"
#include "step_timing.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace activekv {

using detail::Stopwatch;

void LayerStreamer::copy_run_cpu(std::int64_t streamed, const HomeRun& run, bool to_home) {
  at::Tensor& kv = streamed_kv_[static_cast<std::size_t>(streamed)];
  if (!codec_ &&
      kv.is_contiguous()) {  // exact homes and a contiguous ring: bytes straight between rows and blocks
    // One memcpy per stretch of ids consecutive with the rows. Not ATen's
    // copy_: microseconds a call, and a small CPU cache's home rows come in
    // many short runs as requests come and go (9-19 a layer at 3776 tokens
    // in the CPU benchmark where ids alone give 2-3).
    const auto bytes = static_cast<std::size_t>(homes_->layer_bytes());  // one block of the ring
    auto* ring = static_cast<char*>(kv.data_ptr());
    auto* rows = static_cast<char*>(home_bytes_of(streamed, run.rows).data_ptr());
    for (std::size_t i = 0, n = 1; i < run.blocks.size(); i += n) {
      n = 1;
      while (i + n < run.blocks.size() && run.blocks[i + n] == run.blocks[i] + static_cast<std::int64_t>(n))
        ++n;
      char* block = ring + static_cast<std::size_t>(run.blocks[i]) * bytes;
      char* row = rows + i * bytes;
      std::memcpy(to_home ? row : block, to_home ? block : row, n * bytes);
    }
    return;
  }
  if (run.consecutive) {
    const at::Tensor blocks = kv.narrow(0, run.blocks.front(), run.rows.count);
    if (to_home) {
      copy_to_home(streamed, run.rows, blocks);
    } else {
      copy_from_home(streamed, run.rows, blocks);
    }
    return;
  }
  // Compressed homes, or a ring whose blocks are not rows: by index (home_runs
  // made the ids).
  const at::Tensor home = home_bytes_of(streamed, run.rows);
  if (!to_home) {
    kv.index_copy_(0, *run.ids, decode(home));
  } else if (codec_) {
    home.copy_(codec_->encode(kv.index_select(0, *run.ids)));
  } else {
    at::Tensor view = decode(home);  // a view of the home
    at::index_select_out(view, kv, 0, *run.ids);
  }
}

std::uint64_t LayerStreamer::issue(std::function<void()> task, bool wake) {
  if (copy_thread_) return copy_thread_->post(std::move(task), wake);
  task();
  return 0;
}

void LayerStreamer::wait_issued(std::uint64_t task) {
  if (copy_thread_ && task != 0) copy_thread_->wait_for(task);
}

void LayerStreamer::drain_issued() {
  post_written_back_cpu();
  if (copy_thread_) copy_thread_->drain();
}

void LayerStreamer::apply_copy_thread() {
  if (has_streams()) {
    const bool wanted = tuning_.issue_thread && device_.is_cuda();
    if (wanted == (copy_thread_ != nullptr)) return;
    drain_issued();
    copy_thread_ = wanted ? std::make_unique<detail::CopyThread>(device_) : nullptr;
    return;
  }
  // CPU: exact homes and contiguous ring buffers, whose copies are memcpys.
  // Compressed homes' codec is ATen work, whose threads are the forward's.
  const bool wanted = tuning_.cpu_copy_thread && !codec_ &&
                      std::all_of(streamed_kv_.begin(), streamed_kv_.end(),
                                  [](const at::Tensor& kv) { return kv.is_contiguous(); });
  if (wanted == (copy_thread_ != nullptr)) return;
  drain_issued();
  copy_thread_.reset();
  if (step_copies_ == StepCopies::kThread) step_copies_ = StepCopies::kInline;
  copy_thread_cpus_.clear();
  const std::vector<int> beside = wanted ? detail::cpus_beside(detail::forward_cpus()) : std::vector<int>{};
  if (beside.empty()) return;  // the forward may run on every CPU: a thread would take turns with it
  auto thread = std::make_unique<detail::CopyThread>(device_);
  std::vector<int> pinned;
  thread->wait_for(thread->post([&] { pinned = detail::pin_caller_to(beside); }));
  if (pinned.empty()) return;  // the process's cpuset allows none of them
  copy_thread_cpus_ = std::move(pinned);
  copy_thread_ = std::move(thread);
}

void LayerStreamer::take_copy_thread_time(Telemetry& stats) {
  if (const std::int64_t us = copy_thread_us_.exchange(0); us != 0) stats.add(Counter::kStreamUs, us);
}

void LayerStreamer::stage_cpu(std::int64_t streamed) {
  for (const auto& run : stage_home_runs_) copy_run_cpu(streamed, run, /*to_home=*/false);
}

void LayerStreamer::write_back_cpu(std::int64_t streamed) {
  for (const auto& run : writeback_home_runs_) copy_run_cpu(streamed, run, /*to_home=*/true);
}

bool LayerStreamer::posts_stage_cpu(std::int64_t streamed) const {
  return streamed >= 0 && streamed < geometry_.num_streamed() &&
         !stage_issued_[static_cast<std::size_t>(streamed)] && stages_this_step();
}

void LayerStreamer::post_copies_cpu(std::int64_t written, std::int64_t staged, Telemetry* stats, bool due) {
  const bool stage = posts_stage_cpu(staged);
  if (written < 0 && !stage) return;
  if (stage) note_stage_issued(staged, *stats);
  // A sleeping thread is woken for copies due by the next layer's stage(): a
  // wake costs the poster more than a layer's copy at short contexts, so a
  // ring of K wakes it every K layers (copy_thread.h).
  const bool wake =
      due || (stage && staged <= next_stage_) || (not_woken_for_ >= 0 && not_woken_for_ <= next_stage_);
  const std::uint64_t task = issue(
      [this, written, staged, stage] {
        const Stopwatch t;
        if (written >= 0) write_back_cpu(written);
        if (stage) stage_cpu(staged);
        copy_thread_us_ += t.us();
      },
      wake);
  if (wake) {
    not_woken_for_ = -1;
  } else if (stage && not_woken_for_ < 0) {
    not_woken_for_ = staged;
  }
  if (stage) stage_tasks_[static_cast<std::size_t>(staged)] = task;
  // The buffer's next occupant's compute writes the blocks a write-back reads.
  if (const std::int64_t next = written + geometry_.ring_size;
      written >= 0 && next < geometry_.num_streamed()) {
    occupant_writeback_tasks_[static_cast<std::size_t>(next)] = task;
  }
}

void LayerStreamer::post_written_back_cpu() {
  if (copies_on_thread() && written_back_ >= 0)
    post_copies_cpu(std::exchange(written_back_, -1), -1, nullptr, true);
}

// The ring's first occupants; the last step's copies are done (begin_step).
void LayerStreamer::start_on_thread(Telemetry& stats) {
  const auto first = std::min<std::int64_t>(geometry_.ring_size, geometry_.num_streamed());
  next_stage_ = 0;
  not_woken_for_ = -1;
  for (std::int64_t j = 0; j < first; ++j) post_copies_cpu(-1, j, &stats, /*due=*/true);
}

void LayerStreamer::stage_on_thread(std::int64_t j, Telemetry& stats) {
  const auto ju = static_cast<std::size_t>(j);
  post_written_back_cpu();  // stage_ahead did not follow the last write_back
  post_copies_cpu(-1, j, &stats,
                  /*due=*/true);  // not posted ahead (start or the layer K places before did not run)
  // The buffer's last occupant's write-back reads the blocks this layer's
  // compute writes; its staging, posted after it, lands there too.
  wait_issued(std::max(stage_tasks_[ju], occupant_writeback_tasks_[ju]));
  take_copy_thread_time(stats);
}

void LayerStreamer::stage_inline(std::int64_t j, Telemetry& stats) {
  if (!stages_this_step()) return;
  zero_fresh(j);
  const Stopwatch t;
  stage_cpu(j);
  stats.add(Counter::kStreamedBytesToDevice, layer_bytes_of(stage_blocks_));
  stats.add(Counter::kStreamUs, t.us());
}

// The store save read the buffer on this thread, done by now.
void LayerStreamer::stage_ahead_on_thread(std::int64_t j, Telemetry& stats) {
  const std::int64_t written = j == written_back_ ? std::exchange(written_back_, -1) : -1;
  post_written_back_cpu();
  next_stage_ = j + 1;
  // The last layer's write-back overlaps what follows the forward.
  post_copies_cpu(written, j + geometry_.ring_size, &stats, j + 1 == geometry_.num_streamed());
}

}  // namespace activekv
