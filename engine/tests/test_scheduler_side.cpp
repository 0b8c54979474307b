#include <gtest/gtest.h>

#include <numeric>

#include "activekv/layer_streaming.h"
#include "activekv/scheduler_side.h"

namespace activekv {
namespace {

constexpr std::int64_t kBlockSize = 4;
using Ids = std::vector<std::int64_t>;
using New = SchedulerSide::NewRequest;
using Cached = SchedulerSide::CachedRequest;

SchedulerSide streaming_scheduler() {
  return SchedulerSide(Config{}, Digest{}, kBlockSize, /*slot_bytes=*/64, /*num_slots=*/16,
                       /*tp_size=*/1, /*streaming=*/true);
}

Ids tokens(std::int64_t n, std::int64_t first = 100) {
  Ids out(static_cast<std::size_t>(n));
  std::iota(out.begin(), out.end(), first);
  return out;
}

TEST(SchedulerSideStreaming, NewRequestStagesWhatItReadsAndWritesBackWhatItWrites) {
  auto s = streaming_scheduler();
  // A prefill of 10 tokens over blocks 7, 3, 9: reads and writes all three.
  const StepPlan plan = s.build_step({New{"a", {7, 3, 9}, 0, 10}}, {});
  EXPECT_EQ(plan.stage_blocks, (Ids{3, 7, 9}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{3, 7, 9}));
}

TEST(SchedulerSideStreaming, DecodeReadsEveryBlockAndWritesOnlyTheLast) {
  auto s = streaming_scheduler();
  s.build_step({New{"a", {7, 3, 9}, 0, 10}}, {});
  // Token 10 goes to block 9 (slot 2): every block is read, block 9 written.
  StepPlan plan = s.build_step({}, {Cached{"a", false, std::nullopt, 10, 1}});
  EXPECT_EQ(plan.stage_blocks, (Ids{3, 7, 9}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{9}));
  // Token 12 opens a new block (5), appended to the table.
  s.build_step({}, {Cached{"a", false, std::nullopt, 11, 1}});
  plan = s.build_step({}, {Cached{"a", false, Ids{5}, 12, 1}});
  EXPECT_EQ(plan.stage_blocks, (Ids{3, 5, 7, 9}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{5}));
}

TEST(SchedulerSideStreaming, ChunkedPrefillReadsTheEarlierChunks) {
  auto s = streaming_scheduler();
  // 16 prompt tokens in two chunks of 6 and 10 over blocks 1, 2, 3, 4.
  StepPlan plan = s.build_step({New{"a", {1, 2}, 0, 6}}, {});
  EXPECT_EQ(plan.stage_blocks, (Ids{1, 2}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{1, 2}));
  plan = s.build_step({}, {Cached{"a", false, Ids{3, 4}, 6, 10}});
  EXPECT_EQ(plan.stage_blocks, (Ids{1, 2, 3, 4}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{2, 3, 4}));  // block 2 holds tokens 4..7
}

TEST(SchedulerSideStreaming, ResumedOrUnknownRequestsTakeTheirNewTableWhole) {
  auto s = streaming_scheduler();
  s.build_step({New{"a", {1, 2}, 0, 8}}, {});
  // Preempted and resumed: a fresh table, not appended to the old one.
  StepPlan plan = s.build_step({}, {Cached{"a", true, Ids{6, 5}, 0, 8}});
  EXPECT_EQ(plan.stage_blocks, (Ids{5, 6}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{5, 6}));
  // A running request never seen as new (no table yet) is planned from its ids.
  plan = s.build_step({}, {Cached{"b", false, Ids{8}, 0, 3}});
  EXPECT_EQ(plan.stage_blocks, (Ids{8}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{8}));
}

TEST(SchedulerSideStreaming, SharedBlocksAreStagedOnce) {
  auto s = streaming_scheduler();
  // Two requests share a prefix block (4) that vLLM's own cache computed.
  const StepPlan plan =
      s.build_step({New{"a", {4, 1}, 4, 3}, New{"b", {4, 2}, 4, 4}}, {});
  EXPECT_EQ(plan.stage_blocks, (Ids{1, 2, 4}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{1, 2}));
}

TEST(SchedulerSideStreaming, LoadedBlocksAreWrittenBackNotStaged) {
  auto s = streaming_scheduler();
  // Request a stores its two full prompt blocks.
  const Ids prompt = tokens(9);
  s.observe_request("a", std::nullopt, 9, prompt);
  EXPECT_EQ(s.get_num_new_matched_tokens("a", 0), 0);
  s.update_state_after_alloc("a", Ids{0, 1, 2}, 0);
  const StepPlan saved = s.build_step({New{"a", {0, 1, 2}, 0, 9}}, {});
  ASSERT_EQ(saved.saves.size(), 2u);
  WorkerReport report;
  for (const auto& op : saved.saves) report.saved.push_back(op.slot);
  s.apply_report(report);
  EXPECT_FALSE(s.request_finished("a"));
  // Request b, same prompt: both blocks load into 5 and 6; block 7 is computed.
  s.observe_request("b", std::nullopt, 9, prompt);
  EXPECT_EQ(s.get_num_new_matched_tokens("b", 0), 8);
  s.update_state_after_alloc("b", Ids{5, 6, 7}, 8);
  const StepPlan plan = s.build_step({New{"b", {5, 6, 7}, 8, 1}}, {});
  ASSERT_EQ(plan.loads.size(), 2u);
  EXPECT_EQ(plan.stage_blocks, (Ids{7}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{5, 6, 7}));
}

TEST(SchedulerSideStreaming, FinishedRequestsDropTheirTable) {
  auto s = streaming_scheduler();
  s.build_step({New{"a", {1, 2}, 0, 8}}, {});
  EXPECT_FALSE(s.request_finished("a"));
  // Seen again as running (no table): its new ids are its table.
  const StepPlan plan = s.build_step({}, {Cached{"a", false, Ids{3}, 8, 1}});
  EXPECT_EQ(plan.stage_blocks, (Ids{3}));
}

TEST(SchedulerSideStreaming, TheGeometryIsReportedOnceInTheStats) {
  auto s = streaming_scheduler();
  StartupReport report;
  report.resident_layers = 1;
  report.streamed_layers = 15;
  report.ring_size = 2;
  report.device_blocks = 128;
  report.device_blocks_without = 24;
  report.host_bytes = 1 << 20;
  report.decode_step_bytes = 4096;
  s.report_streaming(report);
  const Telemetry first = s.take_telemetry();
  EXPECT_EQ(first.get(Counter::kStreamingResidentLayers), 1);
  EXPECT_EQ(first.get(Counter::kStreamingStreamedLayers), 15);
  EXPECT_EQ(first.get(Counter::kStreamingRingSize), 2);
  EXPECT_EQ(first.get(Counter::kStreamingDeviceBlocks), 128);
  EXPECT_EQ(first.get(Counter::kStreamingDeviceBlocksWithout), 24);
  EXPECT_EQ(first.get(Counter::kStreamingHostBytes), 1 << 20);
  EXPECT_EQ(first.get(Counter::kStreamingDecodeStepBytes), 4096);
  EXPECT_TRUE(s.take_telemetry().empty());  // counted once: a counter reads as the value
}

TEST(SchedulerSideStreaming, NothingPlannedWithoutStreaming) {
  SchedulerSide s(Config{}, Digest{}, kBlockSize, 64, 16, 1);
  const StepPlan plan = s.build_step({New{"a", {7, 3, 9}, 0, 10}}, {});
  EXPECT_TRUE(plan.stage_blocks.empty());
  EXPECT_TRUE(plan.writeback_blocks.empty());
  EXPECT_TRUE(plan.empty());
}

}  // namespace
}  // namespace activekv
