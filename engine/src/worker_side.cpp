#include "activekv/worker_side.h"

#include "step_timing.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

namespace activekv {
namespace {

using detail::current_stream;
using detail::Stopwatch;

constexpr std::size_t kRecentFinished = 4096;
// Steps whose copies to the host may still run when a step ends.
constexpr std::size_t kMaxPendingSaves = 2;

}  // namespace

WorkerSide::WorkerSide(const Config& config, KVLayout layout, std::int64_t num_slots, std::int64_t tp_rank,
                       std::optional<StreamingGeometry> streaming)
    : config_(config),
      layout_(std::move(layout)),
      num_slots_(num_slots),
      tp_rank_(tp_rank),
      layer_bytes_(layout_.layer_bytes(config.mode)),
      streaming_(std::move(streaming)) {
  for (std::size_t i = 0; i < layout_.layer_names.size(); ++i) {
    layer_index_[layout_.layer_names[i]] = static_cast<std::int64_t>(i);
  }
  in_flight_.assign(static_cast<std::size_t>(num_slots_), 0);
}

WorkerSide::~WorkerSide() {
  // Copies still landing in the arena must finish before it is freed.
  try {
    drain_saves();
    if (streamer_) streamer_->synchronize();
    if (load_stream_) load_stream_->synchronize();
    if (async_copy_stream_) async_copy_stream_->synchronize();
    if (async_land_stream_) async_land_stream_->synchronize();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
}

Status WorkerSide::register_kv_caches(const std::unordered_map<std::string, at::Tensor>& kv_caches) {
  std::vector<std::int64_t> block_shape;
  for (const auto& name : layout_.layer_names) {
    const auto it = kv_caches.find(name);
    if (it == kv_caches.end()) {
      return {ErrorCode::kUnsupportedLayout, "ActiveKV: KV cache of layer '" + name + "' was not registered"};
    }
    const auto shape = it->second.sizes().slice(1).vec();
    if (block_shape.empty()) block_shape = shape;
    if (shape != block_shape || it->second[0].numel() != layout_.block_numel()) {
      return {ErrorCode::kUnsupportedLayout,
              "ActiveKV: per-layer KV blocks of layer '" + name + "' do not match the KV cache spec (" +
                  std::to_string(layout_.block_numel()) + " elements per block)"};
    }
    if (it->second.scalar_type() != layout_.dtype) {
      return {ErrorCode::kUnsupportedLayout, "ActiveKV: KV cache dtype does not match the spec"};
    }
    kv_[name] = it->second;
  }
  device_ = kv_.at(layout_.layer_names.front()).device();
  num_device_blocks_ = kv_.at(layout_.layer_names.front()).size(0);
  if (streaming_) {
    auto streamer =
        LayerStreamer::create(*streaming_, kv_, config_.fence_timeout_ms, layout_.head_size, workers_);
    if (!streamer.ok()) return streamer.status();
    streamer_ = std::move(streamer.value());
  }
  if (has_streams()) {
    c10::impl::VirtualGuardImpl impl(device_.type());
    load_stream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
    save_stream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
    gather_stream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
    if (Status st = allocate_ring(step_ring_, staging_pieces_); !st.ok()) return st;
    if (config_.async_load_min_tokens > 0) {
      async_copy_stream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
      async_land_stream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
      if (Status st = allocate_ring(async_ring_, kAsyncLoadStagingPieces); !st.ok()) return st;
    }
  }
  codec_ = make_codec(config_.mode, block_shape, layout_.dtype, layout_.head_size);
  const auto num_layers = static_cast<std::int64_t>(layout_.layer_names.size());
  if (!store_path_.empty()) return open_store_file(block_shape);
  arena_ = std::make_unique<HostArena>(num_slots_, num_layers, layer_bytes_, /*pin=*/has_streams(),
                                       chunk_bytes_for(num_layers));
  if (has_streams()) {  // pinned: allocated at start-up, never by a step's first save
    if (const Status s = arena_->allocate_all(); !s.ok()) {
      return {s.error_code(), "ActiveKV: cannot pin the host store (capacity_bytes=" +
                                  std::to_string(num_slots_ * arena_->slot_bytes()) +
                                  " bytes of pinned host memory): " + s.error() + "; lower capacity_bytes"};
    }
  }
  return Status::Ok();
}

Status WorkerSide::open_store_file(const std::vector<std::int64_t>& block_shape) {
  // What the bytes mean: the identity, and the device blocks' shape and
  // strides (another layout of the same model must not read them).
  const at::Tensor& first = kv_.at(layout_.layer_names.front());
  std::string identity = store_identity_ + " block=";
  for (const auto d : block_shape) identity += std::to_string(d) + ",";
  identity += " strides=";
  for (std::size_t d = 1; d < static_cast<std::size_t>(first.dim()); ++d) {
    identity += std::to_string(first.stride(static_cast<std::int64_t>(d))) + ",";
  }
  const auto num_layers = static_cast<std::int64_t>(layout_.layer_names.size());
  StoreFileOptions o;
  o.path = store_path_;
  o.num_slots = num_slots_;
  o.slot_bytes = num_layers * layer_bytes_;
  o.num_layers = num_layers;
  o.slots_per_chunk = std::max<std::int64_t>(1, chunk_bytes_for(num_layers) / o.slot_bytes);
  o.identity = identity;
  auto file = StoreFile::open(o);
  if (!file.ok()) {
    return {file.status().error_code(), file.status().error() + " (kv_connector_extra_config['store_path'])"};
  }
  arena_ = std::make_unique<HostArena>(num_layers, layer_bytes_,
                                       std::shared_ptr<StoreFile>(std::move(file.value())));
  return Status::Ok();
}

const StoreFile* WorkerSide::store_file() const { return arena_ ? arena_->file() : nullptr; }

void WorkerSide::bind_plan(StepPlan plan) {
  settle_saves(/*wait=*/false);  // frees the slots of saves that landed meanwhile
  auto check_block = [this](std::int64_t block_id) {
    if (block_id < 0 || block_id >= num_device_blocks_) {
      throw std::out_of_range("block id " + std::to_string(block_id) + " out of range (the KV cache has " +
                              std::to_string(num_device_blocks_) + " blocks)");
    }
  };
  auto check = [this, &check_block](std::int64_t slot, std::int64_t block_id) {
    check_block(block_id);
    if (slot < 0 || slot >= num_slots_) {
      throw std::out_of_range("slot " + std::to_string(slot) + " out of range (arena has " +
                              std::to_string(num_slots_) + " slots)");
    }
  };
  auto check_load = [&](const LoadOp& op) {
    if (op.slot == kNoSlot)
      check_block(op.block_id);
    else
      check(op.slot, op.block_id);
  };
  for (const auto& op : plan.loads) check_load(op);
  for (const auto& load : plan.async_loads) {
    for (const auto& op : load.loads) check_load(op);
  }
  for (const auto& ids : {&plan.stage_blocks, &plan.writeback_blocks}) {
    for (const auto block_id : *ids) check_block(block_id);
  }
  if (streamer_) {
    streamer_->check_rows(plan.stage_blocks, plan.stage_rows);
    streamer_->check_rows(plan.writeback_blocks, plan.writeback_rows);
  }
  for (const auto& op : plan.saves) {
    check(op.slot, op.block_id);
    if (arena_->quarantined(op.slot)) {
      throw std::invalid_argument("slot " + std::to_string(op.slot) +
                                  " is quarantined (a fence with an unknown outcome) and is "
                                  "never written again");
    }
    if (in_flight_[static_cast<std::size_t>(op.slot)]) {
      throw std::invalid_argument("slot " + std::to_string(op.slot) +
                                  " still has a save in flight (the scheduler reserves such "
                                  "slots until their save is reported)");
    }
  }
  std::vector<std::int64_t> slots, ids;
  for (const auto& op : plan.saves) {
    slots.push_back(op.slot);
    ids.push_back(op.block_id);
  }
  save_lease_ = arena_->lease(slots);  // unsealed: their bytes are about to be rewritten
  save_runs_ = arena_->runs(slots);
  // Made here, once: a host->device copy from pageable memory waits for the
  // compute stream, which must not happen between layers.
  save_block_ids_ = ids.empty() ? at::Tensor() : block_ids_tensor(ids);
  saved_layers_.clear();
  save_fences_.clear();
  if (streamer_) {
    streamer_->begin_step(plan.stage_blocks, plan.stage_rows, plan.writeback_blocks, plan.writeback_rows);
  }
  // Taken here, not in wait_for_save: vLLM 0.26.0 calls wait_for_save only on
  // steps with a forward, and a request's last saves often settle on an idle
  // step (every request finished), whose plan still names it.
  awaiting_free_.insert(plan.awaiting_free.begin(), plan.awaiting_free.end());
  plan_ = std::move(plan);
}

std::string WorkerSide::tag(const BlockKey& key) const {
  std::string t(key.begin(), key.end());
  for (int i = 0; i < 4; ++i) t.push_back(static_cast<char>((tp_rank_ >> (8 * i)) & 0xff));
  return t;
}

at::Tensor WorkerSide::block_ids_tensor(const std::vector<std::int64_t>& ids) const {
  if (!has_streams()) return at::tensor(ids, at::kLong);
  // From pinned memory and asynchronous, on the compute stream: a pageable
  // upload would hold the host until it is done, and the copy engine idles.
  at::Tensor host = at::empty({static_cast<std::int64_t>(ids.size())},
                              at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  std::copy(ids.begin(), ids.end(), host.data_ptr<std::int64_t>());
  return host.to(device_, /*non_blocking=*/true);
}

void WorkerSide::save_layer(const std::string& layer_name, const at::Tensor& kv_layer) {
  if (!plan_) return;
  const bool streamed = streamer_ != nullptr;
  // The write-back first (the reference's order); then the store save; then
  // the ring buffer is free for the streamed layer K places later, once the
  // store save's gather read it.
  if (streamed) streamer_->write_back(layer_name, stats_);
  std::optional<c10::Event> gathered;
  store_save_layer(layer_name, kv_layer, gathered);
  if (streamed) streamer_->stage_ahead(layer_name, std::move(gathered), stats_);
}

void WorkerSide::store_save_layer(const std::string& layer_name, const at::Tensor& kv_layer,
                                  std::optional<c10::Event>& gathered) {
  const auto layer = layer_index_.find(layer_name);
  if (plan_->saves.empty() || layer == layer_index_.end()) return;
  const Stopwatch t;
  at::Tensor encoded;
  std::optional<c10::StreamGuard> on_save_stream;
  if (has_streams()) {
    // Gather on its own stream, which must see the layer's KV written by the
    // compute stream, so this layer's gather runs while the save stream still
    // copies the layer before: the copy engine never waits for a kernel.
    c10::Event written(device_.type());
    written.record(current_stream(device_));
    written.block(*gather_stream_);
    {
      const c10::StreamGuard on_gather_stream(*gather_stream_);
      encoded = codec_->encode(kv_layer.index_select(0, save_block_ids_));
    }
    gathered.emplace(device_.type());
    gathered->record(*gather_stream_);
    gathered->block(*save_stream_);
    // Made on the gather stream, read on the save stream: not reused before
    // the save stream's copies are done.
    c10::impl::VirtualGuardImpl(device_.type())
        .recordDataPtrOnStream(encoded.storage().data_ptr(), *save_stream_);
    on_save_stream.emplace(*save_stream_);
  } else {
    encoded = codec_->encode(kv_layer.index_select(0, save_block_ids_));
  }
  for (const auto& run : save_runs_) {
    value_or_throw(arena_->run_view(layer->second, run))
        .copy_(encoded.narrow(0, run.offset, run.count), /*non_blocking=*/true);
  }
  if (has_streams()) {
    save_fences_.emplace_back(device_.type());
    save_fences_.back().record(*save_stream_);
  }
  saved_layers_.insert(layer_name);
  stats_.add(Counter::kSaveUs, t.us());
}

void WorkerSide::wait_for_save() {
  if (!plan_) return;
  const auto& ops = plan_->saves;
  if (ops.empty()) return settle_saves(/*wait=*/false);
  if (!streamer_) {
    // Layers save_layer never saw (a full CUDA graph runs no hook): once the
    // forward is done their blocks are final, here as there.
    for (const auto& name : layout_.layer_names) {
      if (saved_layers_.count(name) != 0) continue;
      std::optional<c10::Event> gathered;
      store_save_layer(name, kv_.at(name), gathered);
    }
  }
  const Stopwatch t;
  PendingSave pending;
  pending.lease = std::move(save_lease_);
  pending.fences = std::move(save_fences_);
  pending.whole = saved_layers_.size() == layout_.layer_names.size();
  pending.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.fence_timeout_ms);
  for (const auto& op : ops) pending.tags.push_back(tag(op.key));
  if (has_streams()) {
    // What vLLM needs of this call: nothing after the forward may overwrite a
    // block before its gather read it. The compute stream waits for the
    // gathers (device to device, microseconds); the copies to the host run on
    // and are settled by a later call.
    c10::Event gathered(device_.type());
    gathered.record(*gather_stream_);
    gathered.block(current_stream(device_));
  }
  for (const auto slot : pending.lease.slots) in_flight_[static_cast<std::size_t>(slot)] = 1;
  pending_saves_.push(std::move(pending));
  save_lease_ = SlotLease{};
  save_fences_.clear();
  saved_layers_.clear();
  settle_saves(/*wait=*/false);
  stats_.add(Counter::kSaveUs, t.us());
}

void WorkerSide::settle_saves(bool wait) {
  // Each pending save holds its step's gathered blocks on the device: when the
  // copies fall behind, wait for the oldest rather than let that memory grow.
  pending_saves_.settle(wait, kMaxPendingSaves, outcome,
                        [this](PendingSave& p, bool done) { settle(p, done); });
}

std::optional<bool> WorkerSide::outcome(const PendingSave& p, bool wait) {
  for (const auto& fence : p.fences) {
    const std::optional<bool> done =
        wait ? detail::fence_done_by(fence, p.deadline) : detail::fence_outcome_now(fence, p.deadline);
    if (done != true) return done;  // the first not done decides: running, or unknown
  }
  return true;
}

void WorkerSide::settle(PendingSave& p, bool done) {
  for (const auto slot : p.lease.slots) in_flight_[static_cast<std::size_t>(slot)] = 0;
  if (!done) {  // a copy may still land in these slots: never use them again
    arena_->quarantine(p.lease);
    report_.quarantined.insert(report_.quarantined.end(), p.lease.slots.begin(), p.lease.slots.end());
    stats_.add(Counter::kQuarantinedFences, 1);
  } else if (!p.whole || !arena_->seal(p.lease, p.tags).ok()) {
    // A streamed layer never reached save_layer (its KV left the ring), or
    // the lease went stale: nothing of this step becomes visible.
    report_.failed_saves.insert(report_.failed_saves.end(), p.lease.slots.begin(), p.lease.slots.end());
  } else {
    const auto n = static_cast<std::int64_t>(p.lease.slots.size());
    report_.saved.insert(report_.saved.end(), p.lease.slots.begin(), p.lease.slots.end());
    stats_.add(Counter::kSavedBlocks, n);
    stats_.add(Counter::kBytesToHost, n * arena_->slot_bytes());
  }
}

std::vector<std::string> WorkerSide::get_finished(const std::vector<std::string>& finished_req_ids) {
  // The scheduler's notice comes only once every save of the request was
  // reported settled, so a request kept for its saves is released as soon as
  // both the notice and its finish arrived.
  for (const auto& r : finished_req_ids) {
    recent_finished_.push_back(r);
    if (recent_finished_.size() > kRecentFinished) recent_finished_.pop_front();
  }
  std::vector<std::string> done;
  for (auto it = awaiting_free_.begin(); it != awaiting_free_.end();) {
    if (std::find(recent_finished_.begin(), recent_finished_.end(), *it) != recent_finished_.end()) {
      done.push_back(*it);
      it = awaiting_free_.erase(it);
    } else {
      ++it;
    }
  }
  return done;
}

std::vector<std::int64_t> WorkerSide::take_load_errors() {
  auto out = std::move(load_error_blocks_);
  load_error_blocks_.clear();
  if (streamer_) {  // staged from a home whose write-back had an unknown outcome
    const auto poisoned = streamer_->take_poisoned_stages();
    out.insert(out.end(), poisoned.begin(), poisoned.end());
  }
  return out;
}

std::vector<std::string> WorkerSide::take_landed_requests() {
  std::vector<std::string> landed;
  // In issue order: one stream lands them all.
  while (!async_loads_.empty() && (!async_loads_.front().done || async_loads_.front().done->query())) {
    AsyncLoadInFlight& load = async_loads_.front();
    report_.merge(load.report);
    landed.push_back(std::move(load.req_id));
    async_loads_.pop_front();
  }
  return landed;
}

WorkerReport WorkerSide::take_report() {
  settle_saves(/*wait=*/false);
  WorkerReport out = std::move(report_);
  report_ = WorkerReport{};
  return out;
}

}  // namespace activekv
