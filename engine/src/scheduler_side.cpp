#include "activekv/scheduler_side.h"

#include "activekv/shared_block_index.h"
#include "activekv/store_file.h"
#include "activekv/streaming_geometry.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

namespace activekv {
namespace {

std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Sorted vectors, not sets: streaming's plan runs every step over every
// scheduled block, and sets allocated a node per block (build_connector_meta
// took twice as long with them in the CPU benchmark).
void sort_unique(std::vector<std::int64_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

SchedulerSide::SchedulerSide(const Config& config, const Digest& identity_digest, std::int64_t block_size,
                             std::int64_t slot_bytes, std::int64_t num_slots, std::int64_t tp_size,
                             std::optional<std::int64_t> streaming_blocks)
    : config_(config),
      identity_digest_(identity_digest),
      block_size_(block_size),
      slot_bytes_(slot_bytes),
      tp_size_(tp_size),
      index_(std::make_unique<BlockIndex>(num_slots)),
      policy_(config, slot_bytes) {
  if (streaming_blocks) homes_.emplace(*streaming_blocks);
}

Result<std::string> SchedulerSide::restore_from_store_files() {
  if (config_.store_path.empty()) return std::string();
  // What the files hold, for the first instance to attach: rank 0's order is
  // the LRU order; the other ranks must agree slot by slot.
  const auto sealed_blocks = [this]() -> Result<std::vector<std::pair<BlockKey, std::int64_t>>> {
    std::vector<std::vector<RecoveredSlot>> ranks;
    for (std::int64_t r = 0; r < tp_size_; ++r) {
      auto sealed = StoreFile::read_sealed(store_file_of_rank(config_.store_path, r, tp_size_), "");
      if (!sealed.ok()) return sealed.status();
      ranks.push_back(std::move(sealed.value()));
    }
    std::vector<std::unordered_map<std::int64_t, BlockKey>> by_slot(ranks.size());
    for (std::size_t r = 1; r < ranks.size(); ++r) {
      for (const auto& s : ranks[r]) by_slot[r].emplace(s.slot, key_of(s.tag));
    }
    std::vector<std::pair<BlockKey, std::int64_t>> blocks;
    for (const auto& s : ranks.front()) {
      const BlockKey key = key_of(s.tag);
      bool everywhere = true;
      for (std::size_t r = 1; r < ranks.size() && everywhere; ++r) {
        const auto it = by_slot[r].find(s.slot);
        everywhere = it != by_slot[r].end() && it->second == key;
      }
      if (everywhere) blocks.emplace_back(key, s.slot);
    }
    return blocks;
  };
  auto shared = SharedBlockIndex::open(config_.store_path + ".index", index_->num_slots(), sealed_blocks);
  if (!shared.ok()) {
    return Status(shared.status().error_code(),
                  shared.status().error() + " (kv_connector_extra_config['store_path'])");
  }
  const SharedBlockIndex& ix = *shared.value();
  const std::string files = tp_size_ > 1 ? " (" + std::to_string(tp_size_) + " ranks' files)" : "";
  std::string line = ix.joined()
                         ? "ActiveKV host store " + config_.store_path + files + ": shared with " +
                               std::to_string(ix.live_instances() - 1) + " running vLLM instance(s), " +
                               std::to_string(ix.visible_blocks()) + " blocks stored"
                         : "ActiveKV host store: " + std::to_string(ix.restored()) +
                               " blocks restored from " + config_.store_path + files;
  index_ = std::move(shared.value());
  return line;
}

std::int64_t SchedulerSide::known_tokens(const std::string& req_id) const {
  const auto it = requests_.find(req_id);
  return it == requests_.end() ? 0 : static_cast<std::int64_t>(it->second.tokens.size());
}

void SchedulerSide::observe_request(const std::string& req_id, const std::optional<std::string>& salt,
                                    std::int64_t num_prompt_tokens, std::span<const std::int64_t> tokens) {
  auto [it, created] = requests_.try_emplace(req_id);
  if (created) {
    it->second.salt = salt;
    it->second.num_prompt_tokens = num_prompt_tokens;
  }
  it->second.tokens.insert(it->second.tokens.end(), tokens.begin(), tokens.end());
}

const std::vector<BlockKey>& SchedulerSide::keys_upto(RequestState& st, std::int64_t num_blocks) {
  if (static_cast<std::int64_t>(st.keys.size()) < num_blocks) {
    const auto n =
        std::min<std::size_t>(st.tokens.size(), static_cast<std::size_t>(num_blocks * block_size_));
    extend_block_keys(identity_digest_, st.salt, std::span(st.tokens).first(n), block_size_, st.keys);
  }
  return st.keys;
}

bool SchedulerSide::wants_tokens(const std::string& req_id, std::int64_t computed) const {
  const auto it = requests_.find(req_id);
  if (it == requests_.end()) return false;
  const auto& st = it->second;
  const std::int64_t limit =
      config_.store_blocks == StoreScope::kPrompt ? std::min(computed, st.num_prompt_tokens) : computed;
  return static_cast<std::int64_t>(st.tokens.size()) < limit;
}

std::int64_t SchedulerSide::get_num_new_matched_tokens(const std::string& req_id,
                                                       std::int64_t num_computed_tokens) {
  if (num_computed_tokens % block_size_ != 0) {
    if (const auto it = requests_.find(req_id); it != requests_.end()) {
      it->second.lookup_tokens = 0;
      it->second.load_async = false;
    }
    return 0;
  }
  auto& st = requests_.at(req_id);
  const std::int64_t first = num_computed_tokens / block_size_;
  const std::int64_t limit = loadable_blocks(st.num_prompt_tokens);
  // What the store could serve at most: the full blocks from `first` below it.
  st.lookup_tokens = std::max<std::int64_t>(limit - first, 0) * block_size_;
  const auto& keys = keys_upto(st, limit);
  std::int64_t hits = 0;
  for (std::int64_t i = first; i < limit; ++i) {
    if (!index_->lookup(keys[static_cast<std::size_t>(i)])) break;
    ++hits;
  }
  st.lookup_start = first;
  const std::int64_t async_tokens = config_.async_load_min_tokens;
  st.load_async = async_tokens > 0 && hits > 0 && hits * block_size_ >= async_tokens;
  return hits * block_size_;
}

bool SchedulerSide::loads_async(const std::string& req_id) const {
  const auto it = requests_.find(req_id);
  return it != requests_.end() && it->second.load_async;
}

void SchedulerSide::update_state_after_alloc(const std::string& req_id,
                                             std::span<const std::int64_t> block_ids,
                                             std::int64_t num_external_tokens) {
  auto& st = requests_.at(req_id);
  stats_.add(Counter::kLookups, 1);
  stats_.add(Counter::kLookupTokens, st.lookup_tokens);
  total_lookup_tokens_ += st.lookup_tokens;
  st.lookup_tokens = 0;
  if (num_external_tokens <= 0) return;
  const std::int64_t n = num_external_tokens / block_size_;
  std::vector<LoadOp>& loads =
      st.load_async ? pending_async_loads_.emplace_back(AsyncLoad{req_id, {}}).loads : pending_loads_;
  for (std::int64_t i = st.lookup_start; i < st.lookup_start + n; ++i) {
    const BlockKey& key = st.keys.at(static_cast<std::size_t>(i));
    // Another vLLM sharing the store may have evicted it since the lookup:
    // the worker then reports the load failed, and vLLM computes the block.
    const std::int64_t slot = index_->pin(key).value_or(kNoSlot);
    loads.push_back(LoadOp{slot, block_ids[static_cast<std::size_t>(i)], key});
  }
  stats_.add(Counter::kHitBlocks, n);
  stats_.add(Counter::kHitTokens, num_external_tokens);
  total_hit_tokens_ += num_external_tokens;
}

StepPlan SchedulerSide::build_step(const std::vector<NewRequest>& new_requests,
                                   const std::vector<CachedRequest>& cached_requests) {
  StepPlan plan;
  plan.loads = std::move(pending_loads_);
  plan.async_loads = std::move(pending_async_loads_);
  plan.awaiting_free = std::move(notify_awaiting_);
  pending_loads_.clear();
  pending_async_loads_.clear();
  notify_awaiting_.clear();
  if (homes_) plan_streaming(new_requests, cached_requests, plan);
  for (const auto& r : new_requests) {
    const auto it = requests_.find(r.req_id);
    if (it == requests_.end()) continue;  // never looked up: nothing to do
    auto& st = it->second;
    st.block_ids = r.block_ids;
    st.save_cursor = 0;
    if (!st.sighted) {
      for (const auto& key : keys_upto(st, st.num_prompt_tokens / block_size_)) policy_.sight(key);
      st.sighted = true;
    }
    plan_saves(r.req_id, st, r.num_computed_tokens + r.num_scheduled_tokens, plan);
  }
  for (const auto& r : cached_requests) {
    const auto it = requests_.find(r.req_id);
    if (it == requests_.end()) continue;
    auto& st = it->second;
    if (r.resumed) {  // after preemption: a fresh block list
      st.block_ids = r.new_block_ids.value_or(std::vector<std::int64_t>{});
      st.save_cursor = 0;
    } else if (r.new_block_ids) {
      st.block_ids.insert(st.block_ids.end(), r.new_block_ids->begin(), r.new_block_ids->end());
    }
    plan_saves(r.req_id, st, r.num_computed_tokens + r.num_scheduled_tokens, plan);
  }
  return plan;
}

void SchedulerSide::plan_streaming(const std::vector<NewRequest>& new_requests,
                                   const std::vector<CachedRequest>& cached_requests, StepPlan& plan) {
  // A request computed c tokens and computes s now: its attention reads the
  // blocks holding tokens below c + s, and it writes those holding c .. c+s-1.
  // Its fresh blocks (new content: appended to its table, or past its prefix
  // hit, or without a row yet: a request never seen from its start) get home
  // rows first; they and the loaded ones are not staged, since their homes
  // hold nothing of theirs.
  std::vector<std::int64_t> loaded;
  for (const auto& op : plan.loads) loaded.push_back(op.block_id);
  sort_unique(loaded);
  std::vector<std::int64_t> touched, written, not_staged(loaded);
  const auto add = [&](const std::vector<std::int64_t>& table, std::int64_t computed, std::int64_t scheduled,
                       const std::vector<std::int64_t>& fresh) {
    const auto end =
        std::min(static_cast<std::size_t>(cdiv(computed + scheduled, block_size_)), table.size());
    const auto begin = std::min(static_cast<std::size_t>(computed / block_size_), end);
    touched.insert(touched.end(), table.begin(), table.begin() + static_cast<std::ptrdiff_t>(end));
    written.insert(written.end(), table.begin() + static_cast<std::ptrdiff_t>(begin),
                   table.begin() + static_cast<std::ptrdiff_t>(end));
    not_staged.insert(not_staged.end(), fresh.begin(), fresh.end());
  };
  const auto start_over = [&](const std::string& req_id, std::vector<std::int64_t> table,
                              std::int64_t computed, std::int64_t scheduled) {
    homes_->end_request(req_id);
    std::vector<std::int64_t> fresh;
    const auto hit = static_cast<std::size_t>(cdiv(computed, block_size_));
    for (std::size_t i = 0; i < table.size(); ++i) {
      if (i >= hit || std::binary_search(loaded.begin(), loaded.end(), table[i]) ||
          !homes_->has_row(table[i])) {
        fresh.push_back(table[i]);
      }
    }
    homes_->assign(req_id, fresh);
    auto& stored = block_tables_[req_id] = std::move(table);
    add(stored, computed, scheduled, fresh);
  };
  for (const auto& r : new_requests) {
    start_over(r.req_id, r.block_ids, r.num_computed_tokens, r.num_scheduled_tokens);
  }
  for (const auto& r : cached_requests) {
    const auto it = block_tables_.find(r.req_id);
    if (r.resumed || it == block_tables_.end()) {  // after preemption, or never seen
      start_over(r.req_id, r.new_block_ids.value_or(std::vector<std::int64_t>{}), r.num_computed_tokens,
                 r.num_scheduled_tokens);
      continue;
    }
    const auto fresh = r.new_block_ids.value_or(std::vector<std::int64_t>{});
    it->second.insert(it->second.end(), fresh.begin(), fresh.end());
    homes_->assign(r.req_id, fresh);
    add(it->second, r.num_computed_tokens, r.num_scheduled_tokens, fresh);
  }
  sort_unique(touched);
  sort_unique(not_staged);
  std::vector<std::int64_t> stage;
  std::set_difference(touched.begin(), touched.end(), not_staged.begin(), not_staged.end(),
                      std::back_inserter(stage));
  std::vector<std::int64_t>& writeback = written;
  writeback.insert(writeback.end(), loaded.begin(), loaded.end());
  sort_unique(writeback);
  in_row_order(stage, plan.stage_blocks, plan.stage_rows);
  in_row_order(writeback, plan.writeback_blocks, plan.writeback_rows);
}

void SchedulerSide::in_row_order(const std::vector<std::int64_t>& blocks, std::vector<std::int64_t>& ids,
                                 std::vector<std::int64_t>& rows) const {
  std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
  pairs.reserve(blocks.size());
  for (const auto b : blocks) pairs.emplace_back(homes_->row(b), b);
  std::sort(pairs.begin(), pairs.end());
  ids.reserve(pairs.size());
  rows.reserve(pairs.size());
  for (const auto& [row, block] : pairs) {
    ids.push_back(block);
    rows.push_back(row);
  }
}

void SchedulerSide::plan_saves(const std::string& req_id, RequestState& st, std::int64_t computed,
                               StepPlan& plan) {
  const std::int64_t known = std::min({computed, static_cast<std::int64_t>(st.tokens.size()),
                                       static_cast<std::int64_t>(st.block_ids.size()) * block_size_});
  const std::int64_t full = policy_.savable_blocks(known / block_size_, st.num_prompt_tokens, block_size_);
  const auto& keys = keys_upto(st, full);
  const std::int64_t prompt_blocks = st.num_prompt_tokens / block_size_;
  for (std::int64_t i = st.save_cursor; i < full; ++i) {
    const BlockKey& key = keys[static_cast<std::size_t>(i)];
    if (i >= prompt_blocks) policy_.sight(key);  // decode blocks are sighted when they fill
    if (index_->contains(key)) {
      index_->touch(key);
      continue;
    }
    if (!policy_.admits(key)) {
      stats_.add(Counter::kRejectedThreshold, 1);
      continue;
    }
    if (!policy_.within_request_cap(st.blocks_written)) {
      stats_.add(Counter::kRejectedRequestCap, 1);
      continue;
    }
    auto r = index_->reserve(key);
    if (r.stored_elsewhere) continue;  // another vLLM sharing the store is saving it
    stats_.add(Counter::kEvictedBlocks, static_cast<std::int64_t>(r.evicted.size()));
    if (!r.slot) {
      stats_.add(Counter::kRejectedFull, 1);
      continue;
    }
    plan.saves.push_back(SaveOp{*r.slot, st.block_ids[static_cast<std::size_t>(i)], key, req_id});
    slot_owner_[*r.slot] = req_id;
    ++st.blocks_written;
    ++st.unconfirmed_saves;
  }
  st.save_cursor = std::max(st.save_cursor, full);
}

void SchedulerSide::apply_report(const WorkerReport& report) {
  for (const auto slot : report.saved) {
    if (++confirmations_[slot] == tp_size_) {  // every rank sealed it
      confirmations_.erase(slot);
      index_->commit(slot);
      stats_.add(Counter::kStoredBlocks, 1);
      save_settled(slot);
    }
  }
  for (const auto slot : report.failed_saves) {
    confirmations_.erase(slot);
    index_->discard(slot);
    save_settled(slot);
  }
  for (const auto slot : report.quarantined) {
    confirmations_.erase(slot);
    index_->retire(slot);
    stats_.add(Counter::kQuarantinedFences, 1);
    save_settled(slot);
  }
  for (const auto slot : report.loaded) {
    if (slot != kNoSlot) ++load_reports_[slot];
  }
  for (auto it = load_reports_.begin(); it != load_reports_.end();) {
    while (it->second >= tp_size_) {  // one load done on every rank
      it->second -= tp_size_;
      index_->unpin(it->first);
    }
    it = it->second == 0 ? load_reports_.erase(it) : std::next(it);
  }
  for (const auto slot : report.failed_loads) index_->discard(slot);  // slot lost its block
}

void SchedulerSide::save_settled(std::int64_t slot) {
  const auto owner = slot_owner_.find(slot);
  if (owner == slot_owner_.end()) return;
  const std::string req_id = owner->second;
  slot_owner_.erase(owner);
  if (auto it = requests_.find(req_id); it != requests_.end()) {
    --it->second.unconfirmed_saves;
    return;
  }
  if (auto it = finished_awaiting_.find(req_id); it != finished_awaiting_.end()) {
    if (--it->second.unconfirmed_saves == 0) {
      finished_awaiting_.erase(it);
      notify_awaiting_.push_back(req_id);
    }
  }
}

bool SchedulerSide::request_finished(const std::string& req_id) {
  block_tables_.erase(req_id);
  if (homes_) homes_->end_request(req_id);
  const auto it = requests_.find(req_id);
  if (it == requests_.end()) return false;
  RequestState st = std::move(it->second);
  requests_.erase(it);
  if (st.unconfirmed_saves == 0) return false;
  // Keep the device blocks until the saves reading them are done.
  finished_awaiting_.emplace(req_id, std::move(st));
  return true;
}

}  // namespace activekv

namespace activekv {

void SchedulerSide::report_streaming(const StartupReport& report) {
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  stats_.set(Gauge::kStreamingStreamedLayers, d(report.streamed_layers));
  stats_.set(Gauge::kStreamingDeviceBlocks, d(report.device_blocks));
  stats_.set(Gauge::kStreamingDeviceBlocksWithout, d(report.device_blocks_without));
  stats_.set(Gauge::kStreamingHostBytes, d(report.host_bytes * tp_size_));
  stats_.set(Gauge::kStreamingDecodeStepBytes, d(report.decode_step_bytes * tp_size_));
}

Telemetry SchedulerSide::take_telemetry() {
  const StoreIndex::Occupancy o = index_->occupancy();
  const std::int64_t slots = index_->num_slots();
  const auto bytes = [this](std::int64_t n) { return static_cast<double>(n * slot_bytes_ * tp_size_); };
  stats_.set(Gauge::kStoreBlocks, static_cast<double>(o.visible));
  stats_.set(Gauge::kStoreUsedBytes, bytes(slots - o.free));
  stats_.set(Gauge::kStoreFreeBytes, bytes(o.free));
  stats_.set(Gauge::kStoreCapacityBytes, bytes(slots));
  if (total_lookup_tokens_ > 0) {
    stats_.set(Gauge::kStoreHitRatio,
               static_cast<double>(total_hit_tokens_) / static_cast<double>(total_lookup_tokens_));
  }
  return stats_.take();
}

}  // namespace activekv
