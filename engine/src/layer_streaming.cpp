// LayerStreamer (layer_streaming.h): a step's plan, each per-layer call sent
// to the part for where the step's copies run (StepCopies), the device's
// staging and write-backs on its copy streams, and their fences. Making one
// is layer_streaming_setup.cpp; the home rows' views and runs
// layer_streaming_rows.cpp; the CPU target's parts (inline, or on the copy
// thread) layer_streaming_cpu.cpp; the kDeviceGather copies device_gather.cpp.
#include "activekv/layer_streaming.h"

#include "cuda_batch_copy.h"
#include "activekv/step_runs.h"
#include "step_timing.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace activekv {
namespace {

using detail::current_stream;
using detail::Stopwatch;

SlotRun rows_of(const auto& run) { return SlotRun{run.row, run.count, run.offset}; }

}  // namespace

void LayerStreamer::synchronize() {
  drain_issued();
  if (gather_stream_) gather_stream_->synchronize();
  if (writeback_stream_) writeback_stream_->synchronize();
  if (copy_stream_) copy_stream_->synchronize();
  settle_writebacks(/*wait=*/true);  // all done: their rows' poison is known
}

void LayerStreamer::begin_step(std::vector<std::int64_t> stage_blocks, std::vector<std::int64_t> stage_rows,
                               std::vector<std::int64_t> writeback_blocks,
                               std::vector<std::int64_t> writeback_rows) {
  drain_issued();  // the copy thread's tasks read the step's state
  ++step_;
  // settle_across_steps: where the last step reached every buffer's last
  // occupant; otherwise (the first step, one cut short) as without it.
  from_last_step_ = tuning_.settle_across_steps &&
                    std::all_of(buffer_last_use_.begin(), buffer_last_use_.end(), [this](const auto& u) {
                      return u.attended != nullptr && u.step + 1 == step_;
                    });
  settle_writebacks(/*wait=*/!from_last_step_);
  stage_blocks_ = std::move(stage_blocks);
  stage_rows_ = std::move(stage_rows);
  if (has_streams()) {
    step_copies_ = StepCopies::kDevice;
  } else {
    const bool on_thread =
        copy_thread_ != nullptr && layer_bytes_of(stage_blocks_) >= tuning_.cpu_copy_thread_min_bytes;
    step_copies_ = on_thread ? StepCopies::kThread : StepCopies::kInline;
  }
  writeback_blocks_ = std::move(writeback_blocks);
  writeback_rows_ = std::move(writeback_rows);
  plan_copies();
  // None staged and written back: a ring buffer's next occupant may be staged
  // while its last occupant's write-back still reads the buffer
  // (StreamingTuning). Compressed homes: the others are fresh.
  detail::WrittenOnly written_only = detail::written_not_staged(stage_blocks_, writeback_blocks_);
  stage_writeback_disjoint_ = written_only.all;
  fresh_blocks_ = codec_ ? std::move(written_only.blocks) : std::vector<std::int64_t>{};
  fresh_ids_.reset();
  for (auto& done : occupant_writeback_) done.reset();
  for (std::size_t b = 0; b < buffer_last_use_.size(); ++b) {
    if (from_last_step_) {  // a first occupant's compute writes what the last one's write-back reads
      occupant_writeback_[b] = buffer_last_use_[b].written_back;
    } else {
      buffer_last_use_[b] = BufferLastUse{};  // all landed: nothing to wait for
    }
  }
  stage_index_.reset();
  writeback_index_.reset();
  writeback_long_ids_.reset();
  std::fill(stage_issued_.begin(), stage_issued_.end(), 0);
  start_rest_end_ = 0;
  std::fill(stage_tasks_.begin(), stage_tasks_.end(), 0);
  std::fill(occupant_writeback_tasks_.begin(), occupant_writeback_tasks_.end(), 0);
  std::fill(staged_.begin(), staged_.end(), 0);
  for (auto& fence : stage_fences_) fence.reset();
  note_poisoned_stages();
}

void LayerStreamer::plan_copies() {
  stage_runs_.clear();
  writeback_runs_.clear();
  stage_home_runs_.clear();
  writeback_home_runs_.clear();
  if (stages_by_pieces()) {
    // Batched pieces take every run by the copy engines, a row alone too.
    const std::int64_t copy_engine_run = batched_pieces() ? 1 : tuning_.copy_engine_run;
    pieces_plan_ =
        detail::piece_order(homes_->runs(stage_rows_), stage_blocks_, stage_rows_, copy_engine_run);
    writeback_split_ = detail::split_writeback(homes_->runs(writeback_rows_), writeback_blocks_,
                                               writeback_rows_, copy_engine_run);
  } else {
    pieces_plan_ = {};
    writeback_split_ = {};
    if (!has_streams()) {
      stage_home_runs_ = home_runs(stage_blocks_, stage_rows_);
      writeback_home_runs_ = home_runs(writeback_blocks_, writeback_rows_);
    } else {
      stage_runs_ = detail::pair_runs(homes_->runs(stage_rows_), stage_blocks_, stage_rows_);
      writeback_runs_ = detail::pair_runs(homes_->runs(writeback_rows_), writeback_blocks_, writeback_rows_);
    }
  }
}

void LayerStreamer::note_poisoned_stages() {
  const auto num_rows = static_cast<std::size_t>(homes_->num_slots());
  for (std::size_t i = 0; i < stage_rows_.size(); ++i) {
    for (std::size_t l = 0; l < streamed_kv_.size(); ++l) {
      if (poisoned_[l * num_rows + static_cast<std::size_t>(stage_rows_[i])]) {
        poisoned_stages_.push_back(stage_blocks_[i]);
        break;
      }
    }
  }
}

void LayerStreamer::settle_writebacks(bool wait) {
  // In issue order: a later write-back cannot land before an earlier one (one
  // stream; after a change of copy method the later one waits for the earlier
  // or is ordered after it through the staging and attention between), and a
  // row's last outcome is the one that counts. Waiting,
  // each is bounded by its deadline: the step's staging reads these homes,
  // so their outcome is known before it is planned. Not waiting
  // (settle_across_steps), the device orders the staging after them instead.
  const auto num_rows = static_cast<std::size_t>(homes_->num_slots());
  // Beyond two steps' write-backs in flight the host waits for the oldest.
  pending_writebacks_.settle(
      wait, 2 * static_cast<std::size_t>(geometry_.num_streamed()),
      [](const PendingWriteback& p, bool waiting) -> std::optional<bool> {
        if (waiting) return detail::fence_done_by(*p.fence, p.deadline);
        return detail::fence_outcome_now(*p.fence, p.deadline);
      },
      [&](const PendingWriteback& p, bool done) {
        for (const auto row : p.rows) {
          // A write-back that completed rewrote the whole home row, which clears
          // an earlier write-back's poison; one with an unknown outcome poisons it.
          poisoned_[p.layer * num_rows + static_cast<std::size_t>(row)] = done ? 0 : 1;
        }
        if (done && home_writeback_[p.layer] == p.fence)
          home_writeback_[p.layer].reset();  // nothing to wait for
      });
}

void LayerStreamer::wait_for_last_step(std::size_t streamed) {
  // Only settle_across_steps sets what is waited for here.
  if (auto& fence = home_writeback_[streamed]) {
    fence->block(*copy_stream_);
    // The pieces read the homes there, in this step or, with the copy method
    // changed, a later one: taken now, the fence is not waited for again.
    if (gather_stream_) fence->block(*gather_stream_);
    fence.reset();
  }
  if (streamed >= buffer_last_use_.size()) return;
  BufferLastUse& use = buffer_last_use_[streamed];
  for (auto* event : {&use.attended, &use.written_back, &use.gathered}) {
    if (*event) (*event)->block(*copy_stream_);
    event->reset();
  }
}

void LayerStreamer::zero_fresh(std::int64_t streamed) {
  if (fresh_blocks_.empty()) return;
  at::Tensor& kv = streamed_kv_[static_cast<std::size_t>(streamed)];
  if (!fresh_ids_) {  // once per step
    fresh_ids_ = has_streams() ? upload_ids(fresh_blocks_) : at::tensor(fresh_blocks_, at::kLong);
  }
  // Whole blocks of a contiguous ring as wide words: a fill moves a word per element.
  if (device_gather_possible_) {
    ring_words(kv).index_fill_(0, *fresh_ids_, 0);
  } else {
    kv.index_fill_(0, *fresh_ids_, 0);
  }
}

void LayerStreamer::start(Telemetry& stats) {
  switch (step_copies_) {
    case StepCopies::kThread:
      return start_on_thread(stats);
    case StepCopies::kInline:
      return;  // stage() copies each layer
    case StepCopies::kDevice:
      return start_on_device(stats);
  }
}

void LayerStreamer::start_on_device(Telemetry& stats) {
  if (!stages_this_step()) return;
  const Stopwatch t;
  // The ring's previous occupants (the last layers of the previous step, and
  // whatever vLLM did to the cache before this step) are done with it.
  // settle_across_steps: each buffer's staging waits for its last occupant
  // alone (wait_for_last_step). vLLM does nothing to the cache between forwards.
  std::shared_ptr<c10::Event> compute_done;
  if (!from_last_step_) {
    compute_done = std::make_shared<c10::Event>(device_.type());
    compute_done->record(current_stream(device_));
  }
  const auto first = std::min<std::int64_t>(geometry_.ring_size, geometry_.num_streamed());
  const std::int64_t now = tuning_.start_one_layer ? 1 : first;  // the rest: issue_start_rest
  for (std::int64_t j = 0; j < first; ++j) note_stage_issued(j, stats);
  const std::uint64_t task = issue([this, compute_done, now] {
    if (compute_done) compute_done->block(*copy_stream_);
    for (std::int64_t j = 0; j < now; ++j) issue_stage(j);
  });
  for (std::int64_t j = 0; j < now; ++j) stage_tasks_[static_cast<std::size_t>(j)] = task;
  start_rest_end_ = now < first ? first : 0;
  stats.add(Counter::kStreamUs, t.us());
}

void LayerStreamer::issue_start_rest() {
  if (start_rest_end_ == 0) return;
  const std::int64_t end = start_rest_end_;
  start_rest_end_ = 0;
  const std::uint64_t task = issue([this, end] {
    for (std::int64_t j = 1; j < end; ++j) issue_stage(j, tuning_.ahead_in_one_call);
  });
  for (std::int64_t j = 1; j < end; ++j) stage_tasks_[static_cast<std::size_t>(j)] = task;
}

void LayerStreamer::note_stage_issued(std::int64_t streamed, Telemetry& stats) {
  stage_issued_[static_cast<std::size_t>(streamed)] = 1;
  if (stages_this_step()) {
    stats.add(Counter::kStreamedBytesToDevice, layer_bytes_of(stage_blocks_));
  }
}

void LayerStreamer::issue_stage(std::int64_t streamed, bool one_call) {
  if (!stages_this_step()) return;
  const auto j = static_cast<std::size_t>(streamed);
  at::Tensor& kv = streamed_kv_[j];
  wait_for_last_step(j);
  if (stages_by_pieces() && !stage_blocks_.empty()) gather_stage(streamed);
  const c10::StreamGuard on_copy_stream(*copy_stream_);
  if (copy_method_ == StreamCopy::kRuns) {
    for (const auto& run : stage_runs_) {
      copy_from_home(streamed, rows_of(run), kv.narrow(0, run.block, run.count));
    }
  } else if (copy_method_ == StreamCopy::kCopyEngineBatch && !codec_) {
    batch_copy(streamed, stage_runs_, /*to_home=*/false, *copy_stream_, one_call);
  }
  zero_fresh(streamed);
  stage_fences_[j].emplace(device_.type());
  stage_fences_[j]->record(*copy_stream_);
}

void LayerStreamer::stage(const std::string& name, Telemetry& stats) {
  const auto it = streamed_index_.find(name);
  if (it == streamed_index_.end()) return;
  const std::int64_t j = it->second;
  const auto ju = static_cast<std::size_t>(j);
  if (staged_[ju]) return;
  staged_[ju] = 1;
  switch (step_copies_) {
    case StepCopies::kThread:
      return stage_on_thread(j, stats);
    case StepCopies::kInline:
      return stage_inline(j, stats);
    case StepCopies::kDevice:
      return stage_on_device(j, stats);
  }
}

void LayerStreamer::stage_on_device(std::int64_t j, Telemetry& stats) {
  const auto ju = static_cast<std::size_t>(j);
  const Stopwatch t;
  if (j > 0 && j < start_rest_end_) issue_start_rest();  // in vLLM's order the first write_back did
  if (stages_this_step() && !stage_issued_[ju]) {
    // Not issued ahead (start or the write-back K layers before did not run):
    // the compute stream has queued every earlier layer's attention by now.
    auto compute_done = std::make_shared<c10::Event>(device_.type());
    compute_done->record(current_stream(device_));
    note_stage_issued(j, stats);
    stage_tasks_[ju] = issue([this, compute_done, j] {
      compute_done->block(*copy_stream_);
      issue_stage(j);
    });
  }
  // The events below are recorded by the tasks issuing this layer's staging
  // and its buffer's last occupant's write-back.
  wait_issued(std::max(stage_tasks_[ju], occupant_writeback_tasks_[ju]));
  if (stage_fences_[ju]) stage_fences_[ju]->block(current_stream(device_));
  // The compute writes this step's new blocks, which the buffer's last
  // occupant's write-back may still be reading.
  if (occupant_writeback_[ju]) occupant_writeback_[ju]->block(current_stream(device_));
  stats.add(Counter::kStreamUs, t.us());
}

void LayerStreamer::write_back(const std::string& name, Telemetry& stats) {
  const auto it = streamed_index_.find(name);
  if (it == streamed_index_.end()) return;
  const std::int64_t j = it->second;
  if (step_copies_ == StepCopies::kDevice) return write_back_on_device(j, stats);
  if (writeback_blocks_.empty()) return;
  stats.add(Counter::kStreamedBytesToHost, layer_bytes_of(writeback_blocks_));
  if (step_copies_ == StepCopies::kThread) {
    // Posted with the staging stage_ahead posts next, as one task: waking
    // the thread is the poster's main cost (copy_thread.h).
    post_written_back_cpu();
    written_back_ = j;
    take_copy_thread_time(stats);
    return;
  }
  const Stopwatch t;
  write_back_cpu(j);
  stats.add(Counter::kStreamUs, t.us());
}

void LayerStreamer::write_back_on_device(std::int64_t j, Telemetry& stats) {
  const Stopwatch t;
  // Ahead of this task's wait for the attention: the bus runs on.
  issue_start_rest();
  auto attended = std::make_shared<c10::Event>(device_.type());
  attended->record(current_stream(device_));
  const std::int64_t next = j + geometry_.ring_size;  // the buffer's next occupant
  const bool last_use = carries_last_use(j);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(fence_timeout_ms_);
  const std::uint64_t task =
      issue([this, attended, j, last_use, deadline] { issue_write_back(j, attended, last_use, deadline); });
  if (next < geometry_.num_streamed()) occupant_writeback_tasks_[static_cast<std::size_t>(next)] = task;
  if (!writeback_blocks_.empty()) {
    stats.add(Counter::kStreamedBytesToHost, layer_bytes_of(writeback_blocks_));
  }
  stats.add(Counter::kStreamUs, t.us());
}

void LayerStreamer::issue_write_back(std::int64_t j, const std::shared_ptr<c10::Event>& attended,
                                     bool last_use, std::chrono::steady_clock::time_point deadline) {
  const std::int64_t next = j + geometry_.ring_size;  // the buffer's next occupant
  BufferLastUse* use =
      last_use ? &buffer_last_use_[static_cast<std::size_t>(j % geometry_.ring_size)] : nullptr;
  if (use != nullptr)
    *use = BufferLastUse{attended, nullptr, nullptr, step_};  // stage_ahead adds the store gather
  // Exact homes only: a compressed write-back's encode would sit on the
  // write-back stream too, and crossing apart read no faster (docs/benchmarks/history.md,
  // 2026-12-04).
  const bool own_stream = copy_method_ == StreamCopy::kCopyEngineBatch && !codec_ && tuning_.writeback_stream;
  // The staging of layer j + K into this buffer follows on the copy stream
  // and must come after this layer's attention; so must a write-back there.
  if (use == nullptr || (!writeback_blocks_.empty() && !own_stream)) attended->block(*copy_stream_);
  if (writeback_blocks_.empty()) return;
  PendingWriteback p{writeback_rows_, static_cast<std::size_t>(j),
                     std::make_shared<c10::Event>(device_.type()), deadline};
  const c10::Stream stream = own_stream ? *writeback_stream_ : *copy_stream_;
  {
    const c10::StreamGuard on_stream(stream);
    // The last step's write-back of these homes, where no staging waited for
    // it and it may have crossed on the other stream (the copy method changed).
    if (auto& earlier = home_writeback_[static_cast<std::size_t>(j)]) earlier->block(stream);
    if (own_stream) {
      attended->block(stream);
      batch_copy(j, writeback_runs_, /*to_home=*/true, stream);
    } else if (stages_by_pieces()) {
      gather_write_back(j);
    } else if (copy_method_ == StreamCopy::kCopyEngineBatch) {
      batch_copy(j, writeback_runs_, /*to_home=*/true, stream);
    } else {
      at::Tensor& kv = streamed_kv_[static_cast<std::size_t>(j)];
      for (const auto& run : writeback_runs_) {
        copy_to_home(j, rows_of(run), kv.narrow(0, run.block, run.count));
      }
    }
    p.fence->record(stream);
  }
  // The next occupant's compute writes the blocks this write-back reads.
  if (next < geometry_.num_streamed()) occupant_writeback_[static_cast<std::size_t>(next)] = p.fence;
  if (tuning_.settle_across_steps) home_writeback_[static_cast<std::size_t>(j)] = p.fence;
  if (use != nullptr) {
    use->written_back = p.fence;  // the next step's first staging and compute here wait for it
  } else if (own_stream && !stage_writeback_disjoint_) {
    // Its staging lands in the buffer: on the copy stream it follows this
    // write-back anyway; beside it, it need not wait when no block is both
    // staged and written back.
    p.fence->block(*copy_stream_);
  }
  pending_writebacks_.push(std::move(p));
}

void LayerStreamer::stage_ahead(const std::string& name, std::optional<c10::Event> gathered,
                                Telemetry& stats) {
  const auto it = streamed_index_.find(name);
  if (it == streamed_index_.end()) return;
  switch (step_copies_) {
    case StepCopies::kThread:
      return stage_ahead_on_thread(it->second, stats);
    case StepCopies::kInline:
      return;  // stage() copies each layer when it comes
    case StepCopies::kDevice:
      return stage_ahead_on_device(it->second, std::move(gathered), stats);
  }
}

void LayerStreamer::stage_ahead_on_device(std::int64_t j, std::optional<c10::Event> gathered,
                                          Telemetry& stats) {
  const std::int64_t next = j + geometry_.ring_size;
  const bool stage_next = next < geometry_.num_streamed() && !stage_issued_[static_cast<std::size_t>(next)];
  if (!gathered && !stage_next) return;
  const Stopwatch t;
  if (stage_next) note_stage_issued(next, stats);
  std::shared_ptr<c10::Event> store_gathered;
  if (gathered) store_gathered = std::make_shared<c10::Event>(std::move(*gathered));
  const bool last_use = carries_last_use(j);
  const auto buffer = static_cast<std::size_t>(j % geometry_.ring_size);
  const std::uint64_t task = issue([this, store_gathered, next, stage_next, last_use, buffer] {
    // The store save's gather reads this buffer too: the next occupant waits for it.
    if (store_gathered && last_use) {
      buffer_last_use_[buffer].gathered = store_gathered;
    } else if (store_gathered) {
      store_gathered->block(*copy_stream_);
    }
    if (stage_next) issue_stage(next, tuning_.ahead_in_one_call);
  });
  if (stage_next) stage_tasks_[static_cast<std::size_t>(next)] = task;
  stats.add(Counter::kStreamUs, t.us());
}

std::string LayerStreamer::home_bytes(const std::string& name) {
  const auto it = streamed_index_.find(name);
  if (it == streamed_index_.end()) throw std::invalid_argument("layer '" + name + "' is not streamed");
  synchronize();
  std::string out;
  for (const auto& run : homes_->all_runs()) {
    auto view = homes_->run_view(it->second, run);
    if (!view.ok()) throw std::runtime_error(view.status().error());
    const at::Tensor bytes = view.value().contiguous();
    out.append(reinterpret_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel()));
  }
  return out;
}

std::vector<std::int64_t> LayerStreamer::take_poisoned_stages() {
  auto out = std::move(poisoned_stages_);
  poisoned_stages_.clear();
  return out;
}

}  // namespace activekv
