// The CPU target's ring copies (cpu_ring_copies.h).
#include "cpu_ring_copies.h"

#include "cpu_affinity.h"
#include "step_timing.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace activekv::detail {

CpuRingCopies::CpuRingCopies(StreamedRing& ring, std::int64_t workers) : RingCopies(ring) {
  // CPU copies have landed by the next end_step (which waits for the copy
  // thread's): nothing is left in flight to settle across steps.
  tuning_.settle_across_steps = false;
  // "0": an operator's (and an A/B's) way back; "all": every step's copies
  // on the thread, however short (tests, on the tiny model's short prompts).
  if (workers > 1 || env_says("ACTIVEKV_CPU_COPY_THREAD", "0")) tuning_.cpu_copy_thread = false;
  if (env_says("ACTIVEKV_CPU_COPY_THREAD", "all")) tuning_.cpu_copy_thread_min_bytes = 0;
  apply_copy_thread();
}

CpuRingCopies::~CpuRingCopies() {
  try {
    drain();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
  stop_thread();  // joined before the state its tasks use goes
}

void CpuRingCopies::end_step() { drain(); }

void CpuRingCopies::plan_step() {
  on_thread_ = has_thread() && ring_.layer_bytes_of(ring_.stage_blocks) >= tuning_.cpu_copy_thread_min_bytes;
  stage_runs_ = home_runs(ring_.stage_blocks, ring_.stage_rows);
  writeback_runs_ = home_runs(ring_.writeback_blocks, ring_.writeback_rows);
  fresh_ids_.reset();
  clear_step_tasks();
}

std::vector<CpuRingCopies::HomeRun> CpuRingCopies::home_runs(const std::vector<std::int64_t>& blocks,
                                                             const std::vector<std::int64_t>& rows) const {
  // Made once a step, used by every streamed layer.
  const bool by_index = ring_.codec || !ring_.kv.front().is_contiguous();
  std::vector<HomeRun> out;
  for (const auto& run : ring_.homes->runs(rows)) {
    HomeRun r{run, pair_runs({run}, blocks, rows), std::nullopt};
    if (r.pieces.size() > 1 && by_index) {
      const auto first = blocks.begin() + run.offset;
      r.ids = at::tensor(std::vector<std::int64_t>(first, first + run.count), at::kLong);
    }
    out.push_back(std::move(r));
  }
  return out;
}

void CpuRingCopies::copy_run(std::int64_t streamed, const HomeRun& run, bool to_home) {
  at::Tensor& kv = ring_.kv[static_cast<std::size_t>(streamed)];
  if (!ring_.codec &&
      kv.is_contiguous()) {  // exact homes and a contiguous ring: bytes between rows and blocks
    // One memcpy per piece. Not ATen's copy_: microseconds a call, and a
    // small CPU cache's home rows come in many short runs as requests come and
    // go (9-19 a layer at 3776 tokens in the CPU benchmark where ids alone
    // give 2-3).
    const auto bytes = static_cast<std::size_t>(ring_.homes->layer_bytes());  // one block of the ring
    auto* ring = static_cast<char*>(kv.data_ptr());
    auto* rows = static_cast<char*>(ring_.home_bytes_of(streamed, run.rows).data_ptr());
    for (const auto& piece : run.pieces) {
      char* block = ring + static_cast<std::size_t>(piece.block) * bytes;
      char* row = rows + static_cast<std::size_t>(piece.offset - run.rows.offset) * bytes;
      const auto n = static_cast<std::size_t>(piece.count) * bytes;
      std::memcpy(to_home ? row : block, to_home ? block : row, n);
    }
    return;
  }
  if (run.pieces.size() == 1) {
    const at::Tensor blocks = kv.narrow(0, run.pieces.front().block, run.rows.count);
    if (to_home) {
      ring_.copy_to_home(streamed, run.rows, blocks);
    } else {
      ring_.copy_from_home(streamed, run.rows, blocks);
    }
    return;
  }
  // Compressed homes, or a ring whose blocks are not rows: by index (home_runs
  // made the ids).
  const at::Tensor home = ring_.home_bytes_of(streamed, run.rows);
  if (!to_home) {
    kv.index_copy_(0, *run.ids, ring_.decode(home));
  } else if (ring_.codec) {
    home.copy_(ring_.codec->encode(kv.index_select(0, *run.ids)));
  } else {
    at::Tensor view = ring_.decode(home);  // a view of the home
    at::index_select_out(view, kv, 0, *run.ids);
  }
}

void CpuRingCopies::stage_now(std::int64_t streamed) {
  for (const auto& run : stage_runs_) copy_run(streamed, run, /*to_home=*/false);
}

void CpuRingCopies::write_back_now(std::int64_t streamed) {
  for (const auto& run : writeback_runs_) copy_run(streamed, run, /*to_home=*/true);
}

void CpuRingCopies::zero_fresh(std::int64_t streamed) {
  if (ring_.fresh_blocks.empty()) return;
  if (!fresh_ids_) fresh_ids_ = at::tensor(ring_.fresh_blocks, at::kLong);  // once per step
  ring_.kv[static_cast<std::size_t>(streamed)].index_fill_(0, *fresh_ids_, 0);
}

void CpuRingCopies::apply_copy_thread() {
  // Exact homes and contiguous ring buffers, whose copies are memcpys.
  // Compressed homes' codec is ATen work, whose threads are the forward's.
  const bool wanted =
      tuning_.cpu_copy_thread && !ring_.codec &&
      std::all_of(ring_.kv.begin(), ring_.kv.end(), [](const at::Tensor& kv) { return kv.is_contiguous(); });
  if (wanted == has_thread()) return;
  drain();
  replace_thread(nullptr);
  on_thread_ = false;
  copy_thread_cpus_.clear();
  const std::vector<int> beside = wanted ? cpus_beside(forward_cpus()) : std::vector<int>{};
  if (beside.empty()) return;  // the forward may run on every CPU: a thread would take turns with it
  auto thread = std::make_unique<CopyThread>(ring_.device);
  std::vector<int> pinned;
  thread->wait_for(thread->post([&] { pinned = pin_caller_to(beside); }));
  if (pinned.empty()) return;  // the process's cpuset allows none of them
  copy_thread_cpus_ = std::move(pinned);
  replace_thread(std::move(thread));
}

void CpuRingCopies::set_copy_method(StreamCopy method) { check_can_copy_by(method); }

void CpuRingCopies::set_tuning(const StreamingTuning& tuning) {
  tuning_ = tuning;
  apply_copy_thread();
}

void CpuRingCopies::drain() {
  post_written_back();
  drain_thread();
}

void CpuRingCopies::take_copy_thread_time(Telemetry& stats) {
  if (const std::int64_t us = copy_thread_us_.exchange(0); us != 0) stats.add(Counter::kStreamUs, us);
}

bool CpuRingCopies::posts_stage(std::int64_t streamed) const {
  return streamed >= 0 && streamed < ring_.num_streamed() &&
         !stage_issued_[static_cast<std::size_t>(streamed)] && ring_.stages_this_step();
}

void CpuRingCopies::post_copies(std::int64_t written, std::int64_t staged, Telemetry* stats, bool due) {
  const bool stage = posts_stage(staged);
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
        if (written >= 0) write_back_now(written);
        if (stage) stage_now(staged);
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
  if (const std::int64_t next = written + ring_.geometry.ring_size;
      written >= 0 && next < ring_.num_streamed()) {
    occupant_writeback_tasks_[static_cast<std::size_t>(next)] = task;
  }
}

void CpuRingCopies::post_written_back() {
  if (on_thread_ && written_back_ >= 0) post_copies(std::exchange(written_back_, -1), -1, nullptr, true);
}

void CpuRingCopies::start(Telemetry& stats) {
  if (!on_thread_) return;  // stage() copies each layer
  // The ring's first occupants; the last step's copies are done (end_step).
  const auto first = std::min<std::int64_t>(ring_.geometry.ring_size, ring_.num_streamed());
  next_stage_ = 0;
  not_woken_for_ = -1;
  for (std::int64_t j = 0; j < first; ++j) post_copies(-1, j, &stats, /*due=*/true);
}

void CpuRingCopies::stage(std::int64_t j, Telemetry& stats) {
  if (on_thread_) {
    const auto ju = static_cast<std::size_t>(j);
    post_written_back();  // stage_ahead did not follow the last write_back
    // Not posted ahead (start or the layer K places before did not run).
    post_copies(-1, j, &stats, /*due=*/true);
    // The buffer's last occupant's write-back reads the blocks this layer's
    // compute writes; its staging, posted after it, lands there too.
    wait_issued(std::max(stage_tasks_[ju], occupant_writeback_tasks_[ju]));
    take_copy_thread_time(stats);
    return;
  }
  if (!ring_.stages_this_step()) return;
  zero_fresh(j);
  const Stopwatch t;
  stage_now(j);
  stats.add(Counter::kStreamedBytesToDevice, ring_.layer_bytes_of(ring_.stage_blocks));
  stats.add(Counter::kStreamUs, t.us());
}

void CpuRingCopies::write_back(std::int64_t j, Telemetry& stats) {
  if (ring_.writeback_blocks.empty()) return;
  stats.add(Counter::kStreamedBytesToHost, ring_.layer_bytes_of(ring_.writeback_blocks));
  if (on_thread_) {
    // Posted with the staging stage_ahead posts next, as one task: waking
    // the thread is the poster's main cost (copy_thread.h).
    post_written_back();
    written_back_ = j;
    take_copy_thread_time(stats);
    return;
  }
  const Stopwatch t;
  write_back_now(j);
  stats.add(Counter::kStreamUs, t.us());
}

void CpuRingCopies::stage_ahead(std::int64_t j, std::optional<c10::Event> /*gathered*/, Telemetry& stats) {
  if (!on_thread_) return;  // stage() copies each layer when it comes
  // The store save read the buffer on this thread, done by now.
  const std::int64_t written = j == written_back_ ? std::exchange(written_back_, -1) : -1;
  post_written_back();
  next_stage_ = j + 1;
  // The last layer's write-back overlaps what follows the forward.
  post_copies(written, j + ring_.geometry.ring_size, &stats, j + 1 == ring_.num_streamed());
}

}  // namespace activekv::detail
