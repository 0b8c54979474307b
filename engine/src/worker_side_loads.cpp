// The worker's loads from the host store into vLLM's KV cache: on a device
// in pieces through a ring of staging buffers (load_pieces.h), each landed
// by the compute stream at its layer's wait_for_layer_load; on the CPU read
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
  for (const auto& buffer : staging_) bytes += buffer.numel();
  return bytes;
}

Status WorkerSide::allocate_load_staging() {
  // Rows of a stored block: at most the store's blocks, at least one.
  const std::int64_t rows = std::clamp<std::int64_t>(staging_piece_bytes_ / layer_bytes_, 1, num_slots_);
  staging_.clear();
  try {
    for (std::int64_t k = 0; k < staging_pieces_; ++k) {
      staging_.push_back(
          at::empty({rows, layer_bytes_}, at::TensorOptions().dtype(at::kByte).device(device_)));
    }
  } catch (const c10::Error& e) {
    staging_.clear();
    return {
        ErrorCode::kOutOfMemory,
        "ActiveKV: cannot allocate the loads' staging on " + device_.str() + " (" +
            std::to_string(staging_pieces_ * rows * layer_bytes_) +
            " bytes of device memory beside vLLM's KV cache): " + e.what_without_backtrace() +
            "; leave the device that much more (a lower gpu_memory_utilization or kv_cache_memory_bytes)"};
  }
  staging_free_.clear();
  staging_free_.resize(staging_.size());
  return Status::Ok();
}

void WorkerSide::start_load(bool layer_hooks) {
  load_pieces_.clear();
  piece_ready_.clear();
  pieces_issued_ = pieces_landed_ = 0;
  if (streamer_ && plan_) streamer_->start(stats_);
  if (!plan_ || plan_->loads.empty()) return;
  const Stopwatch t;
  std::vector<std::int64_t> ids, slots;
  for (const auto& op : plan_->loads) {
    report_.loaded.push_back(op.slot);
    if (arena_->holds(op.slot, tag(op.key))) {
      ids.push_back(op.block_id);
      slots.push_back(op.slot);
    } else {  // never serve bytes that are not the block asked for
      report_.failed_loads.push_back(op.slot);
      load_error_blocks_.push_back(op.block_id);
      stats_.add(Counter::kFailedLoads, 1);
    }
  }
  if (ids.empty()) return;
  const auto n = static_cast<std::int64_t>(ids.size());
  load_block_ids_ = block_ids_tensor(ids);
  load_ids_ = std::move(ids);
  load_runs_ = arena_->runs(slots);
  const auto layers = static_cast<std::int64_t>(layout_.layer_names.size());
  // On the CPU a piece is a layer, read where it lies; on a device a piece
  // fills one staging buffer.
  load_pieces_ = detail::load_pieces(layers, n, has_streams() ? staging_.front().size(0) : n);
  piece_ready_.resize(load_pieces_.size());
  while (has_streams() && pieces_issued_ < std::min(load_pieces_.size(), staging_.size())) issue_load_piece();
  stats_.add(Counter::kLoadedBlocks, n);
  stats_.add(Counter::kBytesToDevice, n * arena_->slot_bytes());
  stats_.add(Counter::kLoadUs, t.us());
  if (!layer_hooks) land_loads_through(layers - 1);
}

void WorkerSide::issue_load_piece() {
  // The next piece into the buffer the piece `staging_.size()` before it
  // used, once the compute stream read that one.
  const std::size_t i = pieces_issued_++;
  const detail::LoadPiece& piece = load_pieces_[i];
  const std::size_t b = i % staging_.size();
  const c10::StreamGuard on_load_stream(*load_stream_);
  if (staging_free_[b]) staging_free_[b]->block(*load_stream_);
  for (const auto& part : detail::runs_within(load_runs_, piece.row, piece.rows)) {
    staging_[b]
        .narrow(0, part.offset, part.count)
        .copy_(value_or_throw(arena_->run_view(piece.layer, SlotRun{part.first, part.count, 0})),
               /*non_blocking=*/true);
  }
  piece_ready_[i].emplace(device_.type());
  piece_ready_[i]->record(*load_stream_);
}

void WorkerSide::wait_for_layer_load(const std::string& layer_name) {
  // Streamed layers: their read blocks first, the step's loads on top. Both
  // happen once per layer and step, so vLLM's second call is a no-op.
  if (streamer_ && plan_) streamer_->stage(layer_name, stats_);
  const auto layer = layer_index_.find(layer_name);
  if (layer != layer_index_.end()) land_loads_through(layer->second);
}

void WorkerSide::land_loads_through(std::int64_t layer) {
  if (!staged_loads_this_step() || load_pieces_[pieces_landed_].layer > layer) return;
  const Stopwatch t;
  // In order: a layer whose call never came lands with the next that does.
  while (staged_loads_this_step() && load_pieces_[pieces_landed_].layer <= layer) {
    const std::size_t i = pieces_landed_++;
    const detail::LoadPiece& piece = load_pieces_[i];
    at::Tensor& kv = kv_.at(layout_.layer_names[static_cast<std::size_t>(piece.layer)]);
    const at::Tensor ids = load_block_ids_.narrow(0, piece.row, piece.rows);
    if (!has_streams()) {
      for (const auto& run : load_runs_) {
        kv.index_copy_(0, ids.narrow(0, run.offset, run.count),
                       codec_->decode(value_or_throw(arena_->run_view(piece.layer, run))));
      }
      continue;
    }
    const std::size_t b = i % staging_.size();
    if (!piece_ready_[i]) {  // its copies never started (an arena error): recompute, never serve it
      for (std::int64_t r = 0; r < piece.rows; ++r) {
        load_error_blocks_.push_back(load_ids_[static_cast<std::size_t>(piece.row + r)]);
      }
      continue;
    }
    piece_ready_[i]->block(current_stream(device_));
    kv.index_copy_(0, ids, codec_->decode(staging_[b].narrow(0, 0, piece.rows)));
    staging_free_[b].emplace(device_.type());
    staging_free_[b]->record(current_stream(device_));
    if (pieces_issued_ < load_pieces_.size()) issue_load_piece();
  }
  stats_.add(Counter::kLoadUs, t.us());
}

}  // namespace activekv
