// The worker's loads from the host store into vLLM's KV cache: on a device
// in pieces through a ring of staging buffers (load_pieces.h); the step's
// loads landed by the compute stream at their layer's wait_for_layer_load,
// asynchronous ones by a stream of their own, all at once; on the CPU read
// where the blocks lie.
#include "activekv/worker_side.h"

#include "step_timing.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>

#include <algorithm>
#include <stdexcept>

namespace activekv {

using detail::current_stream;
using detail::Stopwatch;

void WorkerSide::set_load_staging(std::int64_t pieces, std::int64_t piece_bytes) {
  if (pieces < 1 || piece_bytes < 1) {
    throw std::invalid_argument("set_load_staging: pieces and piece_bytes must be positive");
  }
  staging_pieces_ = pieces;
  staging_piece_bytes_ = piece_bytes;
}

std::int64_t WorkerSide::load_staging_bytes() const {
  std::int64_t bytes = 0;
  for (const StagingRing* ring : {&step_ring_, &async_ring_}) {
    for (const auto& buffer : ring->buffers) bytes += buffer.numel();
  }
  return bytes;
}

Status WorkerSide::allocate_ring(StagingRing& ring, std::int64_t pieces) {
  // Rows of a stored block: at most the store's blocks, at least one.
  const std::int64_t rows = std::clamp<std::int64_t>(staging_piece_bytes_ / layer_bytes_, 1, num_slots_);
  ring.buffers.clear();
  try {
    for (std::int64_t k = 0; k < pieces; ++k) {
      ring.buffers.push_back(
          at::empty({rows, layer_bytes_}, at::TensorOptions().dtype(at::kByte).device(device_)));
    }
  } catch (const c10::Error& e) {
    ring.buffers.clear();
    return {
        ErrorCode::kOutOfMemory,
        "ActiveKV: cannot allocate the loads' staging on " + device_.str() + " (" +
            std::to_string(pieces * rows * layer_bytes_) +
            " bytes of device memory beside vLLM's KV cache): " + e.what_without_backtrace() +
            "; leave the device that much more (a lower gpu_memory_utilization or kv_cache_memory_bytes)"};
  }
  ring.free.clear();
  ring.free.resize(ring.buffers.size());
  return Status::Ok();
}

std::optional<WorkerSide::LoadLane> WorkerSide::step_lane() {
  if (!has_streams()) return std::nullopt;
  return LoadLane{&step_ring_, *load_stream_, current_stream(device_)};
}

WorkerSide::LoadBatch WorkerSide::started_batch(const std::vector<LoadOp>& ops, WorkerReport& report,
                                                const std::optional<LoadLane>& lane) {
  LoadBatch batch;
  std::vector<std::int64_t> slots;
  for (const auto& op : ops) {
    report.loaded.push_back(op.slot);
    if (arena_->holds(op.slot, tag(op.key))) {
      batch.ids.push_back(op.block_id);
      slots.push_back(op.slot);
    } else {  // never serve bytes that are not the block asked for
      report.failed_loads.push_back(op.slot);
      load_error_blocks_.push_back(op.block_id);
      stats_.add(Counter::kFailedLoads, 1);
    }
  }
  if (batch.ids.empty()) return batch;
  const auto n = static_cast<std::int64_t>(batch.ids.size());
  {
    std::optional<c10::StreamGuard> on_land_stream;
    if (lane) on_land_stream.emplace(lane->land);
    batch.block_ids = block_ids_tensor(batch.ids);
  }
  batch.runs = arena_->runs(slots);
  // On the CPU a piece is a layer, read where it lies; on a device a piece
  // fills one staging buffer.
  const auto layers = static_cast<std::int64_t>(layout_.layer_names.size());
  batch.pieces = detail::load_pieces(layers, n, lane ? lane->ring->buffers.front().size(0) : n);
  batch.ready.resize(batch.pieces.size());
  while (lane && batch.issued < std::min(batch.pieces.size(), lane->ring->buffers.size())) {
    issue_piece(batch, *lane);
  }
  stats_.add(Counter::kLoadedBlocks, n);
  stats_.add(Counter::kBytesToDevice, n * arena_->slot_bytes());
  return batch;
}

void WorkerSide::start_load(bool layer_hooks) {
  step_loads_ = LoadBatch{};
  if (streamer_ && plan_) streamer_->start(stats_);
  if (!plan_) return;
  if (!plan_->async_loads.empty()) start_async_loads();
  if (plan_->loads.empty()) return;
  const Stopwatch t;
  const std::optional<LoadLane> lane = step_lane();
  step_loads_ = started_batch(plan_->loads, report_, lane);
  stats_.add(Counter::kLoadUs, t.us());
  if (!layer_hooks)
    land_through(step_loads_, static_cast<std::int64_t>(layout_.layer_names.size()) - 1, lane);
}

void WorkerSide::start_async_loads() {
  const Stopwatch t;
  std::optional<LoadLane> lane;
  if (has_streams()) {
    lane = LoadLane{&async_ring_, *async_copy_stream_, *async_land_stream_};
    // Landing waits for the work queued so far: a block vLLM just gave the
    // request may still be written by a step in flight (its last owner's).
    c10::Event queued(device_.type());
    queued.record(current_stream(device_));
    queued.block(lane->land);
  }
  const auto last_layer = static_cast<std::int64_t>(layout_.layer_names.size()) - 1;
  for (const auto& load : plan_->async_loads) {
    AsyncLoadInFlight in_flight{load.req_id, {}, {}, std::nullopt};
    in_flight.batch = started_batch(load.loads, in_flight.report, lane);
    stats_.add(Counter::kAsyncLoadedBlocks, static_cast<std::int64_t>(in_flight.batch.ids.size()));
    land_through(in_flight.batch, last_layer, lane);
    if (lane) {
      in_flight.done.emplace(device_.type());
      in_flight.done->record(lane->land);
    }
    async_loads_.push_back(std::move(in_flight));
  }
  stats_.add(Counter::kLoadUs, t.us());
}

void WorkerSide::issue_piece(LoadBatch& batch, const LoadLane& lane) {
  // The next piece into the buffer the piece `buffers.size()` before it
  // used, once the landing stream read that one.
  const std::size_t i = batch.issued++;
  const detail::LoadPiece& piece = batch.pieces[i];
  StagingRing& ring = *lane.ring;
  const std::size_t b = i % ring.buffers.size();
  const c10::StreamGuard on_copy_stream(lane.copy);
  if (ring.free[b]) ring.free[b]->block(lane.copy);
  for (const auto& part : detail::runs_within(batch.runs, piece.row, piece.rows)) {
    ring.buffers[b]
        .narrow(0, part.offset, part.count)
        .copy_(value_or_throw(arena_->run_view(piece.layer, SlotRun{part.first, part.count, 0})),
               /*non_blocking=*/true);
  }
  batch.ready[i].emplace(device_.type());
  batch.ready[i]->record(lane.copy);
}

void WorkerSide::wait_for_layer_load(const std::string& layer_name) {
  // Streamed layers: their read blocks first, the step's loads on top. Both
  // happen once per layer and step, so vLLM's second call is a no-op.
  if (streamer_ && plan_) streamer_->stage(layer_name, stats_);
  const auto layer = layer_index_.find(layer_name);
  if (layer != layer_index_.end()) land_through(step_loads_, layer->second, step_lane());
}

void WorkerSide::land_through(LoadBatch& batch, std::int64_t layer, const std::optional<LoadLane>& lane) {
  if (!batch.landing() || batch.pieces[batch.landed].layer > layer) return;
  const Stopwatch t;
  // In order: a layer whose call never came lands with the next that does.
  while (batch.landing() && batch.pieces[batch.landed].layer <= layer) {
    const std::size_t i = batch.landed++;
    const detail::LoadPiece& piece = batch.pieces[i];
    at::Tensor& kv = kv_.at(layout_.layer_names[static_cast<std::size_t>(piece.layer)]);
    const at::Tensor ids = batch.block_ids.narrow(0, piece.row, piece.rows);
    if (!lane) {
      for (const auto& run : batch.runs) {
        kv.index_copy_(0, ids.narrow(0, run.offset, run.count),
                       codec_->decode(value_or_throw(arena_->run_view(piece.layer, run))));
      }
      continue;
    }
    StagingRing& ring = *lane->ring;
    const std::size_t b = i % ring.buffers.size();
    if (!batch.ready[i]) {  // its copies never started (an arena error): recompute, never serve it
      for (std::int64_t r = 0; r < piece.rows; ++r) {
        load_error_blocks_.push_back(batch.ids[static_cast<std::size_t>(piece.row + r)]);
      }
      continue;
    }
    const c10::StreamGuard on_land_stream(lane->land);
    batch.ready[i]->block(lane->land);
    kv.index_copy_(0, ids, codec_->decode(ring.buffers[b].narrow(0, 0, piece.rows)));
    ring.free[b].emplace(device_.type());
    ring.free[b]->record(lane->land);
    if (batch.issued < batch.pieces.size()) issue_piece(batch, *lane);
  }
  stats_.add(Counter::kLoadUs, t.us());
}

}  // namespace activekv
