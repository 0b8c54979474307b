#include "activekv/worker_side.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace activekv {
namespace {

constexpr std::size_t kRecentFinished = 4096;

class Stopwatch {
 public:
  std::int64_t us() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

c10::Stream current_stream(c10::Device device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

}  // namespace

WorkerSide::WorkerSide(const Config& config, KVLayout layout, std::int64_t num_slots,
                       std::int64_t tp_rank)
    : config_(config),
      layout_(std::move(layout)),
      num_slots_(num_slots),
      tp_rank_(tp_rank),
      layer_bytes_(layout_.layer_bytes(config.mode)) {
  for (std::size_t i = 0; i < layout_.layer_names.size(); ++i) {
    layer_offset_[layout_.layer_names[i]] = static_cast<std::int64_t>(i) * layer_bytes_;
  }
}

WorkerSide::~WorkerSide() = default;

Status WorkerSide::register_kv_caches(const std::unordered_map<std::string, at::Tensor>& kv_caches) {
  std::vector<std::int64_t> block_shape;
  for (const auto& name : layout_.layer_names) {
    const auto it = kv_caches.find(name);
    if (it == kv_caches.end()) {
      return {ErrorCode::kUnsupportedLayout,
              "ActiveKV: KV cache of layer '" + name + "' was not registered"};
    }
    const auto shape = it->second.sizes().slice(1).vec();
    if (block_shape.empty()) block_shape = shape;
    if (shape != block_shape || it->second[0].numel() != layout_.block_numel()) {
      return {ErrorCode::kUnsupportedLayout,
              "ActiveKV: per-layer KV blocks of layer '" + name +
                  "' do not match the KV cache spec (" + std::to_string(layout_.block_numel()) +
                  " elements per block)"};
    }
    if (it->second.scalar_type() != layout_.dtype) {
      return {ErrorCode::kUnsupportedLayout, "ActiveKV: KV cache dtype does not match the spec"};
    }
    kv_[name] = it->second;
  }
  device_ = kv_.at(layout_.layer_names.front()).device();
  num_device_blocks_ = kv_.at(layout_.layer_names.front()).size(0);
  codec_ = make_codec(config_.mode, block_shape, layout_.dtype, layout_.head_size);
  const bool pin = has_streams();
  arena_ = std::make_unique<HostArena>(num_slots_, layout_.slot_bytes(config_.mode), pin);
  staging_ = std::make_unique<StagingPool>(pin);
  if (has_streams()) {
    c10::impl::VirtualGuardImpl impl(device_.type());
    load_stream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
    save_stream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
  }
  return Status::Ok();
}

void WorkerSide::bind_plan(StepPlan plan) {
  auto check = [this](std::int64_t slot, std::int64_t block_id) {
    if (block_id < 0 || block_id >= num_device_blocks_) {
      throw std::out_of_range("block id " + std::to_string(block_id) +
                              " out of range (the KV cache has " +
                              std::to_string(num_device_blocks_) + " blocks)");
    }
    if (slot < 0 || slot >= num_slots_) {
      throw std::out_of_range("slot " + std::to_string(slot) + " out of range (arena has " +
                              std::to_string(num_slots_) + " slots)");
    }
  };
  for (const auto& op : plan.loads) check(op.slot, op.block_id);
  for (const auto& op : plan.saves) check(op.slot, op.block_id);
  plan_ = std::move(plan);
}

std::string WorkerSide::tag(const BlockKey& key) const {
  std::string t(key.begin(), key.end());
  for (int i = 0; i < 4; ++i) t.push_back(static_cast<char>((tp_rank_ >> (8 * i)) & 0xff));
  return t;
}

void WorkerSide::release_load_leases() {
  // A load's staging goes back to the pool only once its copy has finished.
  for (auto& l : finished_loads_) {
    if (!l.lease) continue;
    try {
      if (l.ready) l.ready->synchronize();
      staging_->release(*l.lease);
    } catch (const c10::Error&) {
      staging_->quarantine(*l.lease);
      stats_.add(Counter::kQuarantinedFences, 1);
    }
  }
  finished_loads_.clear();
}

void WorkerSide::start_load() {
  load_ops_.clear();
  staged_loads_.clear();
  release_load_leases();
  if (!plan_ || plan_->loads.empty()) return;
  const Stopwatch t;
  for (const auto& op : plan_->loads) {
    report_.loaded.push_back(op.slot);
    if (arena_->tag(op.slot) == tag(op.key)) {
      load_ops_.push_back(op);
    } else {  // never serve bytes that are not the block asked for
      report_.failed_loads.push_back(op.slot);
      load_error_blocks_.push_back(op.block_id);
      stats_.add(Counter::kFailedLoads, 1);
    }
  }
  if (load_ops_.empty()) return;
  const auto n = static_cast<std::int64_t>(load_ops_.size());
  std::vector<std::int64_t> ids;
  for (const auto& op : load_ops_) ids.push_back(op.block_id);
  load_block_ids_ = at::tensor(ids, at::kLong).to(device_);
  std::optional<c10::Event> compute_done;
  if (has_streams()) {  // loads write blocks vLLM may still be zeroing
    compute_done.emplace(device_.type());
    compute_done->record(current_stream(device_));
    compute_done->block(*load_stream_);
  }
  for (const auto& name : layout_.layer_names) {
    LayerLoad load;
    std::vector<at::Tensor> rows;
    for (const auto& op : load_ops_) rows.push_back(arena_->view(op.slot, layer_offset_[name], layer_bytes_).value());
    if (!has_streams()) {
      load.rows = at::stack(rows);
    } else {
      auto lease = staging_->acquire(n * layer_bytes_);
      if (!lease.ok()) throw std::runtime_error(lease.status().error());
      at::Tensor staging = lease.value().buffer.view({n, layer_bytes_});
      at::stack_out(staging, rows);
      const c10::StreamGuard guard(*load_stream_);
      load.rows = lease.value().buffer.view({n, layer_bytes_}).to(device_, /*non_blocking=*/true);
      load.ready.emplace(device_.type());
      load.ready->record(*load_stream_);
      load.lease = lease.value();
    }
    staged_loads_.emplace(name, std::move(load));
  }
  stats_.add(Counter::kLoadedBlocks, n);
  stats_.add(Counter::kBytesToDevice, n * layer_bytes_ * static_cast<std::int64_t>(kv_.size()));
  stats_.add(Counter::kLoadUs, t.us());
}

void WorkerSide::wait_for_layer_load(const std::string& layer_name) {
  const auto it = staged_loads_.find(layer_name);
  if (it == staged_loads_.end()) return;
  const Stopwatch t;
  LayerLoad load = std::move(it->second);
  staged_loads_.erase(it);
  if (load.ready) load.ready->block(current_stream(device_));
  kv_.at(layer_name).index_copy_(0, load_block_ids_, codec_->decode(load.rows));
  finished_loads_.push_back(std::move(load));
  stats_.add(Counter::kLoadUs, t.us());
}

void WorkerSide::save_layer(const std::string& layer_name, const at::Tensor& kv_layer) {
  if (!plan_ || plan_->saves.empty() || layer_offset_.count(layer_name) == 0) return;
  const Stopwatch t;
  std::vector<std::int64_t> ids;
  for (const auto& op : plan_->saves) ids.push_back(op.block_id);
  const at::Tensor block_ids = at::tensor(ids, at::kLong).to(kv_layer.device());
  LayerSave save;
  if (!has_streams()) {
    save.rows = codec_->encode(kv_layer.index_select(0, block_ids));
  } else {
    // The save stream must see the layer's KV written by the compute stream.
    c10::Event written(device_.type());
    written.record(current_stream(device_));
    written.block(*save_stream_);
    const c10::StreamGuard guard(*save_stream_);
    const at::Tensor encoded = codec_->encode(kv_layer.index_select(0, block_ids));
    auto lease = staging_->acquire(encoded.numel());
    if (!lease.ok()) throw std::runtime_error(lease.status().error());
    save.rows = lease.value().buffer.view(encoded.sizes());
    save.rows.copy_(encoded, /*non_blocking=*/true);
    save.done.emplace(device_.type());
    save.done->record(*save_stream_);
    save.lease = lease.value();
  }
  staged_saves_.emplace(layer_name, std::move(save));
  stats_.add(Counter::kSaveUs, t.us());
}

void WorkerSide::wait_for_save() {
  auto staged = std::move(staged_saves_);
  staged_saves_.clear();
  if (!plan_) return;
  awaiting_free_.insert(plan_->awaiting_free.begin(), plan_->awaiting_free.end());
  if (plan_->saves.empty()) return;
  const Stopwatch t;
  bool fences_ok = true;
  for (auto& [name, save] : staged) {
    if (!save.lease) continue;
    try {
      save.done->synchronize();
    } catch (const c10::Error&) {
      staging_->quarantine(*save.lease);
      save.lease.reset();
      stats_.add(Counter::kQuarantinedFences, 1);
      fences_ok = false;
    }
  }
  const auto& ops = plan_->saves;
  if (!fences_ok || staged.size() != layout_.layer_names.size()) {
    // A layer never reached save_layer, or its copy failed: no slot is whole.
    for (const auto& op : ops) report_.failed_saves.push_back(op.slot);
  } else {
    for (std::size_t i = 0; i < ops.size(); ++i) {
      for (const auto& [name, save] : staged) {
        const Status s = arena_->write(ops[i].slot, layer_offset_.at(name),
                                       save.rows[static_cast<std::int64_t>(i)]);
        if (!s.ok()) throw std::runtime_error(s.error());
      }
      arena_->seal(ops[i].slot, tag(ops[i].key));
      report_.saved.push_back(ops[i].slot);
    }
    stats_.add(Counter::kSavedBlocks, static_cast<std::int64_t>(ops.size()));
    stats_.add(Counter::kBytesToHost, static_cast<std::int64_t>(ops.size()) * arena_->slot_bytes());
  }
  for (auto& [name, save] : staged) {
    if (save.lease) staging_->release(*save.lease);
  }
  stats_.add(Counter::kSaveUs, t.us());
}

std::vector<std::string> WorkerSide::get_finished(const std::vector<std::string>& finished_req_ids) {
  // Saves complete inside wait_for_save, so a request kept for its saves is
  // released as soon as both the scheduler's notice and its finish arrived.
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
  return out;
}

WorkerReport WorkerSide::take_report() {
  WorkerReport out = std::move(report_);
  report_ = WorkerReport{};
  return out;
}

}  // namespace activekv
