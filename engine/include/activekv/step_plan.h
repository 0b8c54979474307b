// What passes between the scheduler side and the workers each step: plain data.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "activekv/block_key.h"

namespace activekv {

// A load's slot when its block was evicted between the lookup and the pin
// (by another vLLM sharing the store): the worker reports it failed.
inline constexpr std::int64_t kNoSlot = -1;

struct LoadOp {
  std::int64_t slot;      // host slot to read, or kNoSlot
  std::int64_t block_id;  // device block to fill
  BlockKey key;           // block the slot must hold
};

struct SaveOp {
  std::int64_t slot;      // host slot to write (pending until reported)
  std::int64_t block_id;  // device block to read
  BlockKey key;
  std::string req_id;
};

// A request's loads that cross while vLLM keeps the request out of the batch
// (WAITING_FOR_REMOTE_KVS): the workers name it in get_finished's receiving
// set once every one of them landed, failed or not.
struct AsyncLoad {
  std::string req_id;
  std::vector<LoadOp> loads;
};

// Scheduler -> workers.
struct StepPlan {
  // Loads that land inside this step's forward, before their layers' attention.
  std::vector<LoadOp> loads;
  // Loads that land outside the forwards, each request's on its own.
  std::vector<AsyncLoad> async_loads;
  std::vector<SaveOp> saves;
  // Finished requests whose device blocks stay allocated until the workers
  // report that none of their saves is still running.
  std::vector<std::string> awaiting_free;
  // Layer streaming (layer_streaming.h), unique block ids: blocks the step's
  // attention reads and whose home holds their bytes (staged from their
  // homes), and blocks the step writes or loads (copied back to their homes);
  // each list with its blocks' home rows (home_rows.h), in row order.
  std::vector<std::int64_t> stage_blocks;
  std::vector<std::int64_t> stage_rows;
  std::vector<std::int64_t> writeback_blocks;
  std::vector<std::int64_t> writeback_rows;

  // Whether the step plans nothing at all (idle steps share one metadata).
  bool empty() const {
    return loads.empty() && async_loads.empty() && saves.empty() && awaiting_free.empty() &&
           stage_blocks.empty() && writeback_blocks.empty();
  }
};

// A plan of only saves, only loads, or only asynchronous loads.
inline StepPlan saving(std::vector<SaveOp> saves) {
  StepPlan plan;
  plan.saves = std::move(saves);
  return plan;
}
inline StepPlan loading(std::vector<LoadOp> loads) {
  StepPlan plan;
  plan.loads = std::move(loads);
  return plan;
}
inline StepPlan loading_async(std::vector<AsyncLoad> loads) {
  StepPlan plan;
  plan.async_loads = std::move(loads);
  return plan;
}

// Workers -> scheduler; reports of all TP ranks are concatenated.
struct WorkerReport {
  std::vector<std::int64_t> saved;
  std::vector<std::int64_t> failed_saves;
  std::vector<std::int64_t> loaded;  // ok or not
  std::vector<std::int64_t> failed_loads;
  // Saves whose copy has an unknown outcome: the slots are never used again.
  std::vector<std::int64_t> quarantined;

  bool empty() const {
    return saved.empty() && failed_saves.empty() && loaded.empty() && failed_loads.empty() &&
           quarantined.empty();
  }

  // Appends another rank's report, field by field (vLLM aggregates the
  // ranks' reports before the scheduler sees them).
  void merge(const WorkerReport& other) {
    saved.insert(saved.end(), other.saved.begin(), other.saved.end());
    failed_saves.insert(failed_saves.end(), other.failed_saves.begin(), other.failed_saves.end());
    loaded.insert(loaded.end(), other.loaded.begin(), other.loaded.end());
    failed_loads.insert(failed_loads.end(), other.failed_loads.begin(), other.failed_loads.end());
    quarantined.insert(quarantined.end(), other.quarantined.begin(), other.quarantined.end());
  }
};

}  // namespace activekv
