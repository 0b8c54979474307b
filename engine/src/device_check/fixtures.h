// What the device check's scenarios share (internal): how a scenario reports
// what it found, the geometry of their blocks, and a plain step.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>

#include "activekv/config.h"
#include "activekv/device_check.h"
#include "activekv/kv_codec.h"
#include "activekv/kv_layout.h"
#include "activekv/layer_streaming.h"
#include "activekv/step_plan.h"
#include "activekv/worker_side.h"

namespace activekv::device_check {

using Ids = std::vector<std::int64_t>;
using Caches = std::unordered_map<std::string, at::Tensor>;

// What a scenario found wrong: its first few failures name the check, the
// layer and the block; a skip says why the scenario does not apply.
class Findings {
 public:
  void expect(bool ok, const std::string& what) {
    if (ok) return;
    if (failures_.size() < kShown) failures_.push_back(what);
    ++count_;
  }
  void skip(std::string why) { skipped_ = std::move(why); }
  bool skipped() const { return !skipped_.empty(); }

  // The scenario's result, `checked` saying what it covered when it passed.
  CheckResult result(std::string name, const std::string& checked) const {
    CheckResult r{std::move(name), CheckResult::Outcome::kPassed, checked, 0};
    if (count_ > 0) {
      r.outcome = CheckResult::Outcome::kFailed;
      r.detail.clear();
      for (const auto& f : failures_) r.detail += (r.detail.empty() ? "" : "; ") + f;
      if (count_ > kShown) r.detail += "; and " + std::to_string(count_ - kShown) + " more";
    } else if (skipped()) {
      r.outcome = CheckResult::Outcome::kSkipped;
      r.detail = skipped_;
    }
    return r;
  }

 private:
  static constexpr std::size_t kShown = 4;
  std::vector<std::string> failures_;
  std::size_t count_ = 0;
  std::string skipped_;
};

// ---- the geometry of the scenarios: bf16 blocks of 32 tokens ----------------

inline constexpr std::int64_t kBlockSize = 32;

inline KVLayout layout(std::vector<std::string> names, std::int64_t heads, std::int64_t head_size) {
  KVLayout l;
  l.layer_names = std::move(names);
  l.block_size = kBlockSize;
  l.num_kv_heads = heads;
  l.head_size = head_size;
  l.dtype = at::kBFloat16;
  return l;
}

// Blocks of vLLM's paged layout for `l`: [blocks, K/V, tokens, heads * size].
inline at::Tensor blocks(const KVLayout& l, std::int64_t n, c10::Device device, double fill = 0) {
  return at::full({n, 2, kBlockSize, l.num_kv_heads * l.head_size}, fill,
                  at::TensorOptions().dtype(at::kBFloat16).device(device));
}

// Random bf16 of `shape` from a seed of its own: the check never touches
// torch's global generator (an operator's process may rely on it).
inline at::Tensor random(at::IntArrayRef shape, std::uint64_t seed) {
  return at::randn(shape, at::detail::createCPUGenerator(seed)).to(at::kBFloat16);
}

inline bool bitwise(const at::Tensor& a, const at::Tensor& b) {
  return at::equal(a.cpu().view(at::kShort), b.cpu().view(at::kShort));
}

inline BlockKey key(std::uint8_t i) {
  BlockKey k{};
  k.fill(i);
  return k;
}

inline std::string block_of(const std::string& layer, std::int64_t block) {
  return "layer " + layer + " block " + std::to_string(block);
}

// A plain step: load, then per layer wait and save, then wait for the save.
// Without layer hooks, a step as a full CUDA graph replays it: no per-layer
// call, the loads land in start_load and the saves gather in wait_for_save.
inline void step(WorkerSide& w, const KVLayout& l, Caches& kv, StepPlan plan, bool layer_hooks = true) {
  w.bind_plan(std::move(plan));
  w.start_load(layer_hooks);
  if (layer_hooks) {
    for (const auto& n : l.layer_names) {
      w.wait_for_layer_load(n);
      w.save_layer(n, kv.at(n));
    }
  }
  w.wait_for_save();
  w.clear_plan();
}

}  // namespace activekv::device_check
