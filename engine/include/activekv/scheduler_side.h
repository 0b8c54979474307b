// Scheduler side: owns the block index and the admission policy, and decides
// each step which blocks the workers load and save. Mirrors the reference
// (reference/activekv_reference/scheduler.py) decision for decision.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "activekv/admission_policy.h"
#include "activekv/block_index.h"
#include "activekv/config.h"
#include "activekv/home_rows.h"
#include "activekv/step_plan.h"
#include "activekv/telemetry.h"

namespace activekv {

struct StartupReport;  // streaming_geometry.h

class SchedulerSide {
 public:
  // `streaming_blocks` (vLLM's number of KV cache blocks, with layer
  // streaming): every step also names the blocks the workers stage into the
  // ring and write back (layer_streaming.h), from every scheduled request's
  // block table, with their home rows (home_rows.h).
  SchedulerSide(const Config& config, const Digest& identity_digest, std::int64_t block_size,
                std::int64_t slot_bytes, std::int64_t num_slots, std::int64_t tp_size,
                std::optional<std::int64_t> streaming_blocks = std::nullopt);
  SchedulerSide(const SchedulerSide&) = delete;
  SchedulerSide& operator=(const SchedulerSide&) = delete;

  // Token ids the engine holds for the request (0 if unknown).
  std::int64_t known_tokens(const std::string& req_id) const;
  // Registers the request or appends its newest token ids; `tokens` continue
  // from known_tokens(req_id).
  void observe_request(const std::string& req_id, const std::optional<std::string>& salt,
                       std::int64_t num_prompt_tokens, std::span<const std::int64_t> tokens);

  // True if planning saves after `computed` tokens needs token ids the engine
  // does not hold yet (prompt scope needs none past the prompt).
  bool wants_tokens(const std::string& req_id, std::int64_t computed) const;

  // Tokens loadable from the host store past `num_computed_tokens`.
  std::int64_t get_num_new_matched_tokens(const std::string& req_id, std::int64_t num_computed_tokens);
  // Whether the hit the request's last lookup found loads asynchronously:
  // at least config.async_load_min_tokens tokens.
  bool loads_async(const std::string& req_id) const;
  // Whether a prompt of this many tokens could load asynchronously at all:
  // its full blocks below the last token's reach async_load_min_tokens
  // (vLLM 0.34's may_load_async, asked as a request enters the queue).
  bool may_load_async(std::int64_t num_prompt_tokens) const {
    const std::int64_t tokens = config_.async_load_min_tokens;
    return tokens > 0 && loadable_blocks(num_prompt_tokens) * block_size_ >= tokens;
  }
  void update_state_after_alloc(const std::string& req_id, std::span<const std::int64_t> block_ids,
                                std::int64_t num_external_tokens);

  struct NewRequest {
    std::string req_id;
    std::vector<std::int64_t> block_ids;
    std::int64_t num_computed_tokens;
    std::int64_t num_scheduled_tokens;
  };
  struct CachedRequest {
    std::string req_id;
    bool resumed;
    std::optional<std::vector<std::int64_t>> new_block_ids;
    std::int64_t num_computed_tokens;
    std::int64_t num_scheduled_tokens;
  };
  // Must be given every request vLLM scheduled this step (streaming plans
  // from all of them, known or not).
  StepPlan build_step(const std::vector<NewRequest>& new_requests,
                      const std::vector<CachedRequest>& cached_requests);

  void apply_report(const WorkerReport& report);
  // True: keep the request's device blocks until the workers report its saves.
  bool request_finished(const std::string& req_id);
  bool has_pending_work() const { return !finished_awaiting_.empty() || !notify_awaiting_.empty(); }

  // The counters since the last take, and the gauges that changed: the host
  // store's occupancy (of every worker: its slots times slot_bytes times
  // tp_size) and its hit ratio, read from the index now, and the streaming
  // geometry once.
  Telemetry take_telemetry();
  // Streaming's home rows (nullptr without streaming).
  const HomeRows* homes() const { return homes_ ? &*homes_ : nullptr; }
  // The streaming geometry, reported once in the stats as gauges (its byte
  // figures per worker times tp_size, as the store's).
  void report_streaming(const StartupReport& report);
  // With config.store_path: the index becomes the store's shared one
  // (shared_block_index.h, "<store_path>.index"). The first vLLM to attach
  // fills it with the blocks every rank's store file kept (read after the
  // workers opened and verified them), in their LRU order, a block counting
  // only where every rank holds it in the same slot; later ones join it.
  // Returns the line start-up prints. Errors name the file.
  Result<std::string> restore_from_store_files();

 private:
  struct RequestState {
    std::optional<std::string> salt;
    std::int64_t num_prompt_tokens = 0;
    std::vector<std::int64_t> tokens;
    std::vector<BlockKey> keys;
    std::vector<std::int64_t> block_ids;
    std::int64_t lookup_start = 0;
    std::int64_t lookup_tokens = 0;  // what the last lookup could have served
    bool load_async = false;         // the last lookup's hit loads asynchronously
    bool sighted = false;
    std::int64_t save_cursor = 0;
    std::int64_t blocks_written = 0;
    std::int64_t unconfirmed_saves = 0;
  };
  const std::vector<BlockKey>& keys_upto(RequestState& st, std::int64_t num_blocks);
  // The prompt's blocks the store may serve: those below the one holding the
  // last prompt token, which vLLM always computes.
  std::int64_t loadable_blocks(std::int64_t num_prompt_tokens) const {
    return (num_prompt_tokens - 1) / block_size_;
  }
  void plan_saves(const std::string& req_id, RequestState& st, std::int64_t computed, StepPlan& plan);
  void save_settled(std::int64_t slot);
  // The step's stage and write-back blocks; after plan.loads is set.
  void plan_streaming(const std::vector<NewRequest>& new_requests,
                      const std::vector<CachedRequest>& cached_requests, StepPlan& plan);
  // `blocks` in home-row order into `ids`, each with its row in `rows`.
  void in_row_order(const std::vector<std::int64_t>& blocks, std::vector<std::int64_t>& ids,
                    std::vector<std::int64_t>& rows) const;

  Config config_;
  Digest identity_digest_;
  std::int64_t block_size_;
  std::int64_t slot_bytes_;
  std::int64_t tp_size_;
  // Since start-up, for the hit ratio gauge.
  std::int64_t total_lookup_tokens_ = 0;
  std::int64_t total_hit_tokens_ = 0;
  // Streaming (homes_ set): the block table of every scheduled request, as
  // vLLM grows it, and the blocks' home rows.
  std::unordered_map<std::string, std::vector<std::int64_t>> block_tables_;
  std::optional<HomeRows> homes_;
  std::unique_ptr<StoreIndex> index_;  // BlockIndex, or SharedBlockIndex with a store_path
  AdmissionPolicy policy_;
  Telemetry stats_;
  std::unordered_map<std::string, RequestState> requests_;
  std::vector<LoadOp> pending_loads_;
  std::vector<AsyncLoad> pending_async_loads_;
  std::unordered_map<std::int64_t, std::string> slot_owner_;
  std::map<std::int64_t, std::int64_t> confirmations_;  // save reports per slot
  std::map<std::int64_t, std::int64_t> load_reports_;
  std::unordered_map<std::string, RequestState> finished_awaiting_;
  std::vector<std::string> notify_awaiting_;
};

}  // namespace activekv
