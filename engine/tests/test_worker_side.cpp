#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <gtest/gtest.h>

#include <cstring>

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

TEST(WorkerSide, SavedBlocksLoadBackBitwise) {
  Config config;
  WorkerSide w(config, layout(), 8, 0);
  auto kv = caches();
  ASSERT_TRUE(w.register_kv_caches(kv).ok());
  step(w, kv, StepPlan{{}, {SaveOp{0, 3, key(1), "r"}, SaveOp{5, 7, key(2), "r"}}, {}, {}, {}});
  auto report = w.take_report();
  EXPECT_EQ(report.saved, (std::vector<std::int64_t>{0, 5}));
  step(w, kv, StepPlan{{LoadOp{5, 1, key(2)}, LoadOp{0, 2, key(1)}}, {}, {}, {}, {}});
  for (const auto& n : layout().layer_names) {
    EXPECT_TRUE(at::equal(kv[n][1].view(at::kShort), kv[n][7].view(at::kShort)));
    EXPECT_TRUE(at::equal(kv[n][2].view(at::kShort), kv[n][3].view(at::kShort)));
  }
  EXPECT_EQ(w.take_report().loaded, (std::vector<std::int64_t>{5, 0}));
  EXPECT_TRUE(w.take_load_errors().empty());
}

TEST(WorkerSide, RefusesSlotHoldingAnotherBlock) {
  Config config;
  WorkerSide w(config, layout(), 4, 0);
  auto kv = caches();
  ASSERT_TRUE(w.register_kv_caches(kv).ok());
  step(w, kv, StepPlan{{}, {SaveOp{2, 4, key(1), "r"}}, {}, {}, {}});
  w.take_report();
  const at::Tensor before = kv["l0"][6].clone();
  step(w, kv, StepPlan{{LoadOp{2, 6, key(9)}}, {}, {}, {}, {}});
  EXPECT_EQ(w.take_load_errors(), (std::vector<std::int64_t>{6}));
  EXPECT_EQ(w.take_report().failed_loads, (std::vector<std::int64_t>{2}));
  EXPECT_TRUE(at::equal(kv["l0"][6], before));
}

TEST(WorkerSide, MissingLayerFailsTheStepSaves) {
  Config config;
  WorkerSide w(config, layout(), 4, 0);
  auto kv = caches();
  ASSERT_TRUE(w.register_kv_caches(kv).ok());
  w.bind_plan(StepPlan{{}, {SaveOp{1, 0, key(1), "r"}}, {}, {}, {}});
  w.save_layer("l0", kv["l0"]);
  w.wait_for_save();
  const auto report = w.take_report();
  EXPECT_TRUE(report.saved.empty());
  EXPECT_EQ(report.failed_saves, (std::vector<std::int64_t>{1}));
  EXPECT_FALSE(w.arena()->tag(1));
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

// The accelerator torch was built for, when one is present: the tests below
// run there too (streams, events, pinned memory), and are skipped elsewhere.
std::optional<c10::Device> accelerator() {
  const auto type = at::accelerator::getAccelerator(false);
  if (!type || at::accelerator::deviceCount() == 0) return std::nullopt;
  return c10::Device(*type, 0);
}

TEST(WorkerSideOnAccelerator, SavedBlocksLoadBackBitwise) {
  const auto device = accelerator();
  if (!device) GTEST_SKIP() << "no accelerator in this torch build or machine";
  for (const Mode mode : {Mode::kExact, Mode::kCompressed}) {
    Config config;
    config.mode = mode;
    WorkerSide w(config, layout(), 64, 0);
    auto kv = caches();
    for (auto& [name, t] : kv) t = t.to(*device);
    ASSERT_TRUE(w.register_kv_caches(kv).ok());
    // Slots 10..12 form one run, 40 another: both copy paths.
    step(w, kv, StepPlan{{}, {SaveOp{10, 3, key(1), "r"}, SaveOp{11, 7, key(2), "r"},
                              SaveOp{12, 5, key(3), "r"}, SaveOp{40, 9, key(4), "r"}}, {}, {}, {}});
    w.drain_saves();  // on a device the copies settle after their step
    EXPECT_EQ(w.take_report().saved, (std::vector<std::int64_t>{10, 11, 12, 40}));
    std::unordered_map<std::string, at::Tensor> host;
    for (const auto& [name, t] : kv) host[name] = t.cpu();
    step(w, kv, StepPlan{{LoadOp{40, 0, key(4)}, LoadOp{10, 1, key(1)}, LoadOp{11, 2, key(2)}},
                         {}, {}, {}, {}});
    EXPECT_TRUE(w.take_load_errors().empty());
    for (const auto& n : layout().layer_names) {
      const at::Tensor after = kv[n].cpu();
      if (mode == Mode::kExact) {
        EXPECT_TRUE(at::equal(after[0].view(at::kShort), host[n][9].view(at::kShort)));
        EXPECT_TRUE(at::equal(after[1].view(at::kShort), host[n][3].view(at::kShort)));
        EXPECT_TRUE(at::equal(after[2].view(at::kShort), host[n][7].view(at::kShort)));
      } else {  // int8 with per-token-per-head scales: close, not equal
        EXPECT_TRUE(at::allclose(after[1].to(at::kFloat), host[n][3].to(at::kFloat), 0.05, 0.05));
      }
      EXPECT_TRUE(at::equal(after[4].view(at::kShort), host[n][4].view(at::kShort)));  // untouched
    }
  }
}

// A save of 1.5 GiB: 4096 blocks of 128 KiB per layer over 3 layers, far
// more than a millisecond of copying at any PCIe speed.
constexpr std::int64_t kBigBlocks = 4096;

KVLayout big_layout() {
  KVLayout big = layout();
  big.num_kv_heads = 8;
  big.head_size = 128;
  return big;
}

std::unordered_map<std::string, at::Tensor> big_caches(c10::Device device) {
  std::unordered_map<std::string, at::Tensor> kv;
  for (const auto& n : big_layout().layer_names) {
    kv[n] = at::ones({kBigBlocks, 2, 32, 8 * 128}, at::TensorOptions().dtype(at::kBFloat16).device(device));
  }
  return kv;
}

// One step saving every block into the slot of its number; returns once
// wait_for_save did, with the copies possibly still running.
void issue_big_save(WorkerSide& w, const std::unordered_map<std::string, at::Tensor>& kv) {
  StepPlan plan;
  for (std::int64_t b = 0; b < kBigBlocks; ++b) {
    plan.saves.push_back(SaveOp{b, b, key(static_cast<std::uint8_t>(b % 200)), "r"});
  }
  w.bind_plan(std::move(plan));
  for (const auto& n : big_layout().layer_names) w.save_layer(n, kv.at(n));
  w.wait_for_save();
  w.clear_plan();
}

TEST(WorkerSideOnAccelerator, FenceTimeoutQuarantinesTheLease) {
  const auto device = accelerator();
  if (!device) GTEST_SKIP() << "no accelerator in this torch build or machine";
  constexpr std::int64_t kBlocks = kBigBlocks;
  auto kv = big_caches(*device);
  Config config;
  config.fence_timeout_ms = 1;
  WorkerSide w(config, big_layout(), kBlocks + 1, 0);
  ASSERT_TRUE(w.register_kv_caches(kv).ok());
  issue_big_save(w, kv);
  w.drain_saves();  // waits at most until the deadline, then quarantines
  const auto report = w.take_report();
  EXPECT_TRUE(report.saved.empty());
  EXPECT_EQ(report.quarantined.size(), static_cast<std::size_t>(kBlocks));
  EXPECT_EQ(w.take_telemetry().get(Counter::kQuarantinedFences), 1);
  EXPECT_EQ(w.arena()->quarantined_count(), kBlocks);
  EXPECT_FALSE(w.arena()->tag(0));
  at::accelerator::synchronizeDevice(0);  // the late copies land in quarantined slots only
  EXPECT_FALSE(w.arena()->tag(kBlocks - 1));
  // A quarantined slot is never written again; a fresh one still is.
  EXPECT_THROW(w.bind_plan(StepPlan{{}, {SaveOp{0, 0, key(1), "r"}}, {}, {}, {}}), std::invalid_argument);
  step(w, kv, StepPlan{{}, {SaveOp{kBlocks, 0, key(1), "r"}}, {}, {}, {}});
  w.drain_saves();
  EXPECT_EQ(w.take_report().saved, (std::vector<std::int64_t>{kBlocks}));
}

TEST(WorkerSideOnAccelerator, SaveSettlesAfterItsStepAndOnlyThenIsVisible) {
  const auto device = accelerator();
  if (!device) GTEST_SKIP() << "no accelerator in this torch build or machine";
  constexpr std::int64_t kBlocks = kBigBlocks;
  auto kv = big_caches(*device);
  WorkerSide w(Config{}, big_layout(), kBlocks, 0);
  ASSERT_TRUE(w.register_kv_caches(kv).ok());
  issue_big_save(w, kv);  // returns with the copies to the host still running
  EXPECT_TRUE(w.has_pending_saves());
  EXPECT_FALSE(w.arena()->tag(kBlocks - 1));  // not visible before its copy completed
  // Its slots are not written again while the copy runs.
  EXPECT_THROW(w.bind_plan(StepPlan{{}, {SaveOp{0, 0, key(1), "r"}}, {}, {}, {}}), std::invalid_argument);
  // The next step runs meanwhile, and its writes to the KV cache come after the gathers.
  for (auto& [n, t] : kv) t.fill_(2);
  w.drain_saves();
  EXPECT_FALSE(w.has_pending_saves());
  const auto report = w.take_report();
  EXPECT_EQ(report.saved.size(), static_cast<std::size_t>(kBlocks));
  EXPECT_TRUE(report.quarantined.empty());
  EXPECT_TRUE(w.arena()->tag(kBlocks - 1));
  // The host holds what the blocks held at the save (ones), not the later twos.
  const std::string bytes = w.arena()->slot_data(kBlocks - 1).value();
  const at::Tensor one = at::ones({1}, at::kBFloat16);
  const auto one_bits = *reinterpret_cast<const std::uint16_t*>(one.data_ptr());
  for (std::size_t i = 0; i < bytes.size(); i += 2) {
    std::uint16_t v;
    std::memcpy(&v, bytes.data() + i, 2);
    ASSERT_EQ(v, one_bits) << "byte " << i;
  }
}

}  // namespace
}  // namespace activekv
