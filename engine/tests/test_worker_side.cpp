#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "activekv/worker_side.h"

namespace activekv {
namespace {

KVLayout layout() {
  KVLayout l;
  l.layer_names = {"l0", "l1", "l2"};
  l.block_size = 32;
  l.num_kv_heads = 2;
  l.head_size = 32;
  l.dtype = at::kBFloat16;
  return l;
}

std::unordered_map<std::string, at::Tensor> caches() {
  at::manual_seed(1);
  std::unordered_map<std::string, at::Tensor> kv;
  for (const auto& n : layout().layer_names) kv[n] = at::randn({12, 2, 32, 64}).to(at::kBFloat16);
  return kv;
}

BlockKey key(std::uint8_t i) {
  BlockKey k{};
  k.fill(i);
  return k;
}

void step(WorkerSide& w, std::unordered_map<std::string, at::Tensor>& kv, StepPlan plan) {
  w.bind_plan(std::move(plan));
  w.start_load();
  for (const auto& n : layout().layer_names) {
    w.wait_for_layer_load(n);
    w.save_layer(n, kv.at(n));
  }
  w.wait_for_save();
  w.clear_plan();
}

// Where each test starts: a worker of `num_slots` host slots, registered
// over caches().
struct Registered {
  explicit Registered(const Config& config = {}, std::int64_t num_slots = 4)
      : w(config, layout(), num_slots, 0), kv(caches()) {
    const Status s = w.register_kv_caches(kv);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error());
  }
  WorkerSide w;
  std::unordered_map<std::string, at::Tensor> kv;
};

TEST(WorkerSide, SavedBlocksLoadBackBitwise) {
  Registered r({}, 8);
  auto& [w, kv] = r;
  step(w, kv, saving({SaveOp{0, 3, key(1), "r"}, SaveOp{5, 7, key(2), "r"}}));
  auto report = w.take_report();
  EXPECT_EQ(report.saved, (std::vector<std::int64_t>{0, 5}));
  step(w, kv, loading({LoadOp{5, 1, key(2)}, LoadOp{0, 2, key(1)}}));
  for (const auto& n : layout().layer_names) {
    EXPECT_TRUE(at::equal(kv[n][1].view(at::kShort), kv[n][7].view(at::kShort)));
    EXPECT_TRUE(at::equal(kv[n][2].view(at::kShort), kv[n][3].view(at::kShort)));
  }
  EXPECT_EQ(w.take_report().loaded, (std::vector<std::int64_t>{5, 0}));
  EXPECT_TRUE(w.take_load_errors().empty());
  const Telemetry counted = w.take_telemetry();
  EXPECT_EQ(counted.get(Counter::kLoadedBlocks), 2);
  EXPECT_EQ(counted.get(Counter::kAsyncLoadedBlocks), 0);  // loaded in their step
}

TEST(WorkerSide, RefusesSlotHoldingAnotherBlock) {
  Registered r;
  auto& [w, kv] = r;
  step(w, kv, saving({SaveOp{2, 4, key(1), "r"}}));
  w.take_report();
  const at::Tensor before = kv["l0"][6].clone();
  step(w, kv, loading({LoadOp{2, 6, key(9)}}));
  EXPECT_EQ(w.take_load_errors(), (std::vector<std::int64_t>{6}));
  EXPECT_EQ(w.take_report().failed_loads, (std::vector<std::int64_t>{2}));
  EXPECT_TRUE(at::equal(kv["l0"][6], before));
}

// vLLM 0.26.0 calls no wait_for_save on a step without a forward (every
// request finished, its saves settling): the notice bound with that step's
// plan must still release the request.
TEST(WorkerSide, FinishedRequestReleasedOnAStepWithoutForward) {
  Registered r;
  auto& [w, kv] = r;
  StepPlan idle;
  idle.awaiting_free = {"r1"};
  w.bind_plan(std::move(idle));
  EXPECT_TRUE(w.get_finished({}).empty());
  EXPECT_EQ(w.get_finished({"r1", "r2"}), (std::vector<std::string>{"r1"}));
  w.clear_plan();
  EXPECT_TRUE(w.get_finished({"r1"}).empty());
  EXPECT_TRUE(w.nothing_awaiting());
}

// A full CUDA graph runs no per-layer hook: wait_for_save gathers the layers
// save_layer never saw, and start_load(false) lands the loads at once.
TEST(WorkerSide, LayersWithoutHooksAreSavedAtWaitForSaveAndLoadedAtStartLoad) {
  Registered r;
  auto& [w, kv] = r;
  w.bind_plan(saving({SaveOp{1, 0, key(1), "r"}}));
  w.save_layer("l0", kv["l0"]);  // l1, l2: no hook
  w.wait_for_save();
  w.clear_plan();
  const auto report = w.take_report();
  EXPECT_EQ(report.saved, (std::vector<std::int64_t>{1}));
  EXPECT_TRUE(report.failed_saves.empty());
  ASSERT_TRUE(w.arena()->tag(1));

  w.bind_plan(loading({LoadOp{1, 5, key(1)}}));
  w.start_load(/*layer_hooks=*/false);
  for (const auto& n : layout().layer_names) {  // landed before any wait_for_layer_load
    EXPECT_TRUE(at::equal(kv[n][5].view(at::kShort), kv[n][0].view(at::kShort))) << n;
  }
  w.wait_for_save();
  w.clear_plan();
  EXPECT_EQ(w.take_report().loaded, (std::vector<std::int64_t>{1}));
}

// Asynchronous loads land while vLLM keeps their request out of the batch:
// the request is named once all its loads landed (a failed one included), and
// only then are its slots reported read (the scheduler unpins them then).
TEST(WorkerSide, AsyncLoadsNameTheirRequestOnceLandedAndReportTheirSlotsThen) {
  Config config;
  config.async_load_min_tokens = 64;
  Registered r(config, 8);
  auto& [w, kv] = r;
  step(w, kv, saving({SaveOp{0, 3, key(1), "r"}, SaveOp{5, 7, key(2), "r"}}));
  w.take_report();
  w.take_telemetry();
  EXPECT_TRUE(w.nothing_awaiting());
  // "a" loads slots 5 and 0 into blocks 1 and 2; "b" asks slot 0 for a block it does not hold.
  step(w, kv,
       loading_async({AsyncLoad{"a", {LoadOp{5, 1, key(2)}, LoadOp{0, 2, key(1)}}},
                      AsyncLoad{"b", {LoadOp{0, 9, key(7)}}}}));
  EXPECT_FALSE(w.nothing_awaiting());
  EXPECT_EQ(w.take_load_errors(), (std::vector<std::int64_t>{9}));
  const Telemetry counted = w.take_telemetry();
  EXPECT_EQ(counted.get(Counter::kLoadedBlocks), 2);
  EXPECT_EQ(counted.get(Counter::kAsyncLoadedBlocks), 2);  // b's failed load is neither
  EXPECT_TRUE(w.take_report().loaded.empty());             // not before the request is named
  EXPECT_EQ(w.take_landed_requests(), (std::vector<std::string>{"a", "b"}));
  for (const auto& n : layout().layer_names) {
    EXPECT_TRUE(at::equal(kv[n][1].view(at::kShort), kv[n][7].view(at::kShort))) << n;
    EXPECT_TRUE(at::equal(kv[n][2].view(at::kShort), kv[n][3].view(at::kShort))) << n;
  }
  const WorkerReport report = w.take_report();
  EXPECT_EQ(report.loaded, (std::vector<std::int64_t>{5, 0, 0}));
  EXPECT_EQ(report.failed_loads, (std::vector<std::int64_t>{0}));
  EXPECT_TRUE(w.take_landed_requests().empty());
  EXPECT_TRUE(w.nothing_awaiting());
}

TEST(WorkerSide, RejectsAnAsyncLoadOutsideTheCacheAndBindsNothing) {
  Registered r;
  auto& [w, kv] = r;
  EXPECT_THROW(w.bind_plan(loading_async({AsyncLoad{"a", {LoadOp{1, 12, key(1)}}}})), std::out_of_range);
  EXPECT_THROW(w.bind_plan(loading_async({AsyncLoad{"a", {LoadOp{4, 1, key(1)}}}})), std::out_of_range);
  EXPECT_FALSE(w.async_loads_this_step());
}

TEST(WorkerSide, RejectsCachesThatDoNotMatchTheSpec) {
  Config config;
  WorkerSide w(config, layout(), 4, 0);
  auto kv = caches();
  kv.erase("l2");
  const Status s = w.register_kv_caches(kv);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error().find("'l2'"), std::string::npos);
}

// The same worker on a device (streams, events, pinned memory, fences that
// outlast their step or their deadline): src/device_check/, run by
// test_device_check.cpp on CPU and on the accelerator.

}  // namespace
}  // namespace activekv
