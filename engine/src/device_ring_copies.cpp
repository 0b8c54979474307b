// A device's ring copies (device_ring_copies.h): the step's order on the copy
// streams, the fences between them and the compute stream, and the
// write-backs' settlement. The copy methods' parts are device_copy_methods.cpp.
#include "device_ring_copies.h"

#include "cuda_batch_copy.h"
#include "cuda_codec_kernels.h"
#include "step_timing.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <exception>
#include <utility>

namespace activekv::detail {
namespace {

SlotRun rows_of(const PairRun& run) { return SlotRun{run.row, run.count, run.offset}; }

}  // namespace

DeviceRingCopies::DeviceRingCopies(StreamedRing& ring, std::int64_t fence_timeout_ms, std::int64_t head_size)
    : RingCopies(ring),
      fence_timeout_ms_(fence_timeout_ms),
      copy_stream_(c10::impl::VirtualGuardImpl(ring.device.type())
                       .getStreamFromGlobalPool(ring.device, tuning_.copy_high_priority)) {
  const auto n = static_cast<std::size_t>(ring_.num_streamed());
  stage_fences_.resize(n);
  occupant_writeback_.resize(n);
  home_writeback_.resize(n);
  buffer_last_use_.resize(
      static_cast<std::size_t>(std::min<std::int64_t>(ring_.geometry.ring_size, ring_.num_streamed())));
  device_gather_possible_ = init_device_gather();
  if (device_gather_possible_) method_ = StreamCopy::kDeviceGather;
  batch_copy_possible_ = device_gather_possible_ && init_batch_copy();
  if (batch_copy_possible_ && ring_.homes->layer_bytes() >= kMinBatchCopyBytes) {
    method_ = StreamCopy::kCopyEngineBatch;
  }
  if (ring_.codec && device_gather_possible_ && ring_.device.is_cuda()) load_fused_codec(head_size);
  apply_issue_thread();
  // =0: an operator's (and the vLLM benchmarks' A/B) way back to the host
  // settling each step.
  if (env_says("ACTIVEKV_SETTLE_ACROSS_STEPS", "0")) tuning_.settle_across_steps = false;
}

DeviceRingCopies::~DeviceRingCopies() {
  try {
    synchronize();  // copies still landing in the homes must finish before they are freed
  } catch (...) {   // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
  stop_thread();  // joined before the state its tasks use goes
}

void DeviceRingCopies::apply_issue_thread() {
  const bool wanted = tuning_.issue_thread && ring_.device.is_cuda();
  if (wanted == has_thread()) return;
  replace_thread(wanted ? std::make_unique<CopyThread>(ring_.device) : nullptr);
}

void DeviceRingCopies::synchronize() {
  // The streams are waited for also where the copy thread's last task failed
  // (drain_thread rethrows its error): the copies it issued before still land,
  // and the destructor frees what they write.
  std::exception_ptr thread_failed;
  try {
    drain_thread();
  } catch (...) {
    thread_failed = std::current_exception();
  }
  if (gather_stream_) gather_stream_->synchronize();
  if (writeback_stream_) writeback_stream_->synchronize();
  copy_stream_.synchronize();
  if (thread_failed) std::rethrow_exception(thread_failed);
  settle_writebacks(/*wait=*/true);  // all done: their rows' poison is known
}

void DeviceRingCopies::set_tuning(const StreamingTuning& tuning) {
  // A stream is fetched again only when its priority changes: the pool hands
  // out its streams in turn, and a step's speed should not depend on which.
  const bool new_copy_stream = tuning.copy_high_priority != tuning_.copy_high_priority;
  const bool new_gather_stream = tuning.gather_high_priority != tuning_.gather_high_priority;
  tuning_ = tuning;
  c10::impl::VirtualGuardImpl impl(ring_.device.type());
  if (new_copy_stream) copy_stream_ = impl.getStreamFromGlobalPool(ring_.device, tuning_.copy_high_priority);
  if (device_gather_possible_) {
    if (new_gather_stream)
      gather_stream_ = impl.getStreamFromGlobalPool(ring_.device, tuning_.gather_high_priority);
    make_pieces();
  }
  apply_issue_thread();
}

bool DeviceRingCopies::can_copy_by(StreamCopy method) const {
  switch (method) {
    case StreamCopy::kRuns:
      return true;
    case StreamCopy::kDeviceGather:
      return device_gather_possible_;
    case StreamCopy::kCopyEngineBatch:
      return batch_copy_possible_;
  }
  return false;
}

void DeviceRingCopies::set_copy_method(StreamCopy method) {
  check_can_copy_by(method);
  drain_thread();  // the copy thread's tasks read it
  method_ = method;
}

void DeviceRingCopies::end_step() {
  drain_thread();  // the copy thread's tasks read the step's state
  ++step_;
  // settle_across_steps: where the last step reached every buffer's last
  // occupant; otherwise (the first step, one cut short) as without it.
  from_last_step_ = tuning_.settle_across_steps &&
                    std::all_of(buffer_last_use_.begin(), buffer_last_use_.end(), [this](const auto& u) {
                      return u.attended != nullptr && u.step + 1 == step_;
                    });
  settle_writebacks(/*wait=*/!from_last_step_);
}

void DeviceRingCopies::plan_step() {
  stage_runs_.clear();
  writeback_runs_.clear();
  if (stages_by_pieces()) {
    // Batched pieces take every run by the copy engines, a row alone too.
    const std::int64_t copy_engine_run = batched_pieces() ? 1 : tuning_.copy_engine_run;
    pieces_plan_ = piece_order(ring_.homes->runs(ring_.stage_rows), ring_.stage_blocks, ring_.stage_rows,
                               copy_engine_run);
    writeback_split_ = split_writeback(ring_.homes->runs(ring_.writeback_rows), ring_.writeback_blocks,
                                       ring_.writeback_rows, copy_engine_run);
  } else {
    pieces_plan_ = {};
    writeback_split_ = {};
    stage_runs_ = pair_runs(ring_.homes->runs(ring_.stage_rows), ring_.stage_blocks, ring_.stage_rows);
    writeback_runs_ =
        pair_runs(ring_.homes->runs(ring_.writeback_rows), ring_.writeback_blocks, ring_.writeback_rows);
  }
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
  clear_step_tasks();
  for (auto& fence : stage_fences_) fence.reset();
}

void DeviceRingCopies::settle_writebacks(bool wait) {
  // In issue order: a later write-back cannot land before an earlier one (one
  // stream; after a change of copy method the later one waits for the earlier
  // or is ordered after it through the staging and attention between), and a
  // row's last outcome is the one that counts. Waiting,
  // each is bounded by its deadline: the step's staging reads these homes,
  // so their outcome is known before it is planned. Not waiting
  // (settle_across_steps), the device orders the staging after them instead.
  const auto num_rows = static_cast<std::size_t>(ring_.homes->num_slots());
  // Beyond two steps' write-backs in flight the host waits for the oldest.
  pending_writebacks_.settle(
      wait, 2 * static_cast<std::size_t>(ring_.num_streamed()),
      [](const PendingWriteback& p, bool waiting) -> std::optional<bool> {
        if (waiting) return fence_done_by(*p.fence, p.deadline);
        return fence_outcome_now(*p.fence, p.deadline);
      },
      [&](const PendingWriteback& p, bool done) {
        for (const auto row : p.rows) {
          // A write-back that completed rewrote the whole home row, which clears
          // an earlier write-back's poison; one with an unknown outcome poisons it.
          ring_.poisoned[p.layer * num_rows + static_cast<std::size_t>(row)] = done ? 0 : 1;
        }
        if (done && home_writeback_[p.layer] == p.fence)
          home_writeback_[p.layer].reset();  // nothing to wait for
      });
}

void DeviceRingCopies::wait_for_last_step(std::size_t streamed) {
  // Only settle_across_steps sets what is waited for here.
  if (auto& fence = home_writeback_[streamed]) {
    fence->block(copy_stream_);
    // The pieces read the homes there, in this step or, with the copy method
    // changed, a later one: taken now, the fence is not waited for again.
    if (gather_stream_) fence->block(*gather_stream_);
    fence.reset();
  }
  if (streamed >= buffer_last_use_.size()) return;
  BufferLastUse& use = buffer_last_use_[streamed];
  for (auto* event : {&use.attended, &use.written_back, &use.gathered}) {
    if (*event) (*event)->block(copy_stream_);
    event->reset();
  }
}

void DeviceRingCopies::zero_fresh(std::int64_t streamed) {
  if (ring_.fresh_blocks.empty()) return;
  at::Tensor& kv = ring_.kv[static_cast<std::size_t>(streamed)];
  if (!fresh_ids_) fresh_ids_ = upload_ids(ring_.fresh_blocks);  // once per step
  // Whole blocks of a contiguous ring as wide words: a fill moves a word per element.
  if (device_gather_possible_) {
    ring_words(kv).index_fill_(0, *fresh_ids_, 0);
  } else {
    kv.index_fill_(0, *fresh_ids_, 0);
  }
}

void DeviceRingCopies::start(Telemetry& stats) {
  if (!ring_.stages_this_step()) return;
  const Stopwatch t;
  // The ring's previous occupants (the last layers of the previous step, and
  // whatever vLLM did to the cache before this step) are done with it.
  // settle_across_steps: each buffer's staging waits for its last occupant
  // alone (wait_for_last_step). vLLM does nothing to the cache between forwards.
  std::shared_ptr<c10::Event> compute_done;
  if (!from_last_step_) {
    compute_done = std::make_shared<c10::Event>(ring_.device.type());
    compute_done->record(current_stream(ring_.device));
  }
  const auto first = std::min<std::int64_t>(ring_.geometry.ring_size, ring_.num_streamed());
  for (std::int64_t j = 0; j < first; ++j) note_stage_issued(j, stats);
  const std::uint64_t task = issue([this, compute_done, first] {
    if (compute_done) compute_done->block(copy_stream_);
    for (std::int64_t j = 0; j < first; ++j) issue_stage(j);
  });
  for (std::int64_t j = 0; j < first; ++j) stage_tasks_[static_cast<std::size_t>(j)] = task;
  stats.add(Counter::kStreamUs, t.us());
}

void DeviceRingCopies::issue_stage(std::int64_t streamed, bool one_call) {
  if (!ring_.stages_this_step()) return;
  const auto j = static_cast<std::size_t>(streamed);
  at::Tensor& kv = ring_.kv[j];
  wait_for_last_step(j);
  if (stages_by_pieces() && !ring_.stage_blocks.empty()) gather_stage(streamed);
  const c10::StreamGuard on_copy_stream(copy_stream_);
  if (method_ == StreamCopy::kRuns) {
    for (const auto& run : stage_runs_) {
      ring_.copy_from_home(streamed, rows_of(run), kv.narrow(0, run.block, run.count));
    }
  } else if (method_ == StreamCopy::kCopyEngineBatch && !ring_.codec) {
    batch_copy(streamed, stage_runs_, /*to_home=*/false, copy_stream_, one_call);
  }
  zero_fresh(streamed);
  stage_fences_[j].emplace(ring_.device.type());
  stage_fences_[j]->record(copy_stream_);
}

void DeviceRingCopies::stage(std::int64_t j, Telemetry& stats) {
  const auto ju = static_cast<std::size_t>(j);
  const Stopwatch t;
  if (ring_.stages_this_step() && !stage_issued_[ju]) {
    // Not issued ahead (start or the write-back K layers before did not run):
    // the compute stream has queued every earlier layer's attention by now.
    auto compute_done = std::make_shared<c10::Event>(ring_.device.type());
    compute_done->record(current_stream(ring_.device));
    note_stage_issued(j, stats);
    stage_tasks_[ju] = issue([this, compute_done, j] {
      compute_done->block(copy_stream_);
      issue_stage(j);
    });
  }
  // The events below are recorded by the tasks issuing this layer's staging
  // and its buffer's last occupant's write-back.
  wait_issued(std::max(stage_tasks_[ju], occupant_writeback_tasks_[ju]));
  if (stage_fences_[ju]) stage_fences_[ju]->block(current_stream(ring_.device));
  // The compute writes this step's new blocks, which the buffer's last
  // occupant's write-back may still be reading.
  if (occupant_writeback_[ju]) occupant_writeback_[ju]->block(current_stream(ring_.device));
  stats.add(Counter::kStreamUs, t.us());
}

void DeviceRingCopies::write_back(std::int64_t j, Telemetry& stats) {
  const Stopwatch t;
  auto attended = std::make_shared<c10::Event>(ring_.device.type());
  attended->record(current_stream(ring_.device));
  const std::int64_t next = j + ring_.geometry.ring_size;  // the buffer's next occupant
  const bool last_use = carries_last_use(j);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(fence_timeout_ms_);
  const std::uint64_t task =
      issue([this, attended, j, last_use, deadline] { issue_write_back(j, attended, last_use, deadline); });
  if (next < ring_.num_streamed()) occupant_writeback_tasks_[static_cast<std::size_t>(next)] = task;
  if (!ring_.writeback_blocks.empty()) {
    stats.add(Counter::kStreamedBytesToHost, ring_.layer_bytes_of(ring_.writeback_blocks));
  }
  stats.add(Counter::kStreamUs, t.us());
}

void DeviceRingCopies::issue_write_back(std::int64_t j, const std::shared_ptr<c10::Event>& attended,
                                        bool last_use, std::chrono::steady_clock::time_point deadline) {
  const std::int64_t next = j + ring_.geometry.ring_size;  // the buffer's next occupant
  BufferLastUse* use =
      last_use ? &buffer_last_use_[static_cast<std::size_t>(j % ring_.geometry.ring_size)] : nullptr;
  if (use != nullptr)
    *use = BufferLastUse{attended, nullptr, nullptr, step_};  // stage_ahead adds the store gather
  // Exact homes only: a compressed write-back's encode would sit on the
  // write-back stream too, and crossing apart read no faster
  // (docs/benchmarks/history.md, 2026-12-04).
  const bool own_stream = method_ == StreamCopy::kCopyEngineBatch && !ring_.codec && tuning_.writeback_stream;
  // The staging of layer j + K into this buffer follows on the copy stream
  // and must come after this layer's attention; so must a write-back there.
  if (use == nullptr || (!ring_.writeback_blocks.empty() && !own_stream)) attended->block(copy_stream_);
  if (ring_.writeback_blocks.empty()) return;
  PendingWriteback p{ring_.writeback_rows, static_cast<std::size_t>(j),
                     std::make_shared<c10::Event>(ring_.device.type()), deadline};
  const c10::Stream stream = own_stream ? *writeback_stream_ : copy_stream_;
  {
    const c10::StreamGuard on_stream(stream);
    // The last step's write-back of these homes, where no staging waited for
    // it and it may have crossed on the other stream (the copy method changed).
    if (auto& earlier = home_writeback_[static_cast<std::size_t>(j)]) earlier->block(stream);
    if (own_stream) attended->block(stream);
    copy_write_back(j, stream);
    p.fence->record(stream);
  }
  // The next occupant's compute writes the blocks this write-back reads.
  if (next < ring_.num_streamed()) occupant_writeback_[static_cast<std::size_t>(next)] = p.fence;
  if (tuning_.settle_across_steps) home_writeback_[static_cast<std::size_t>(j)] = p.fence;
  if (use != nullptr) {
    use->written_back = p.fence;  // the next step's first staging and compute here wait for it
  } else if (own_stream && !ring_.stage_writeback_disjoint) {
    // Its staging lands in the buffer: on the copy stream it follows this
    // write-back anyway; beside it, it need not wait when no block is both
    // staged and written back.
    p.fence->block(copy_stream_);
  }
  pending_writebacks_.push(std::move(p));
}

void DeviceRingCopies::copy_write_back(std::int64_t j, const c10::Stream& stream) {
  if (stages_by_pieces()) {
    gather_write_back(j);
  } else if (method_ == StreamCopy::kCopyEngineBatch) {
    batch_copy(j, writeback_runs_, /*to_home=*/true, stream);
  } else {
    at::Tensor& kv = ring_.kv[static_cast<std::size_t>(j)];
    for (const auto& run : writeback_runs_) {
      ring_.copy_to_home(j, rows_of(run), kv.narrow(0, run.block, run.count));
    }
  }
}

void DeviceRingCopies::stage_ahead(std::int64_t j, std::optional<c10::Event> gathered, Telemetry& stats) {
  const std::int64_t next = j + ring_.geometry.ring_size;
  const bool stage_next = next < ring_.num_streamed() && !stage_issued_[static_cast<std::size_t>(next)];
  if (!gathered && !stage_next) return;
  const Stopwatch t;
  if (stage_next) note_stage_issued(next, stats);
  std::shared_ptr<c10::Event> store_gathered;
  if (gathered) store_gathered = std::make_shared<c10::Event>(std::move(*gathered));
  const bool last_use = carries_last_use(j);
  const auto buffer = static_cast<std::size_t>(j % ring_.geometry.ring_size);
  const std::uint64_t task = issue([this, store_gathered, next, stage_next, last_use, buffer] {
    // The store save's gather reads this buffer too: the next occupant waits for it.
    if (store_gathered && last_use) {
      buffer_last_use_[buffer].gathered = store_gathered;
    } else if (store_gathered) {
      store_gathered->block(copy_stream_);
    }
    if (stage_next) issue_stage(next, tuning_.ahead_in_one_call);
  });
  if (stage_next) stage_tasks_[static_cast<std::size_t>(next)] = task;
  stats.add(Counter::kStreamUs, t.us());
}

}  // namespace activekv::detail
