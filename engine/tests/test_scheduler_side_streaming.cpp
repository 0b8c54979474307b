#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "activekv/scheduler_side.h"
#include "activekv/streaming_geometry.h"
#include "scheduler_side_testing.h"

namespace activekv {
namespace {

using namespace scheduler_testing;  // NOLINT: the shared helpers of these tests

// 64 device blocks: home extents of 4 rows (home_rows.h).
SchedulerSide streaming_scheduler() {
  return SchedulerSide(Config{}, Digest{}, kBlockSize, /*slot_bytes=*/64, /*num_slots=*/16,
                       /*tp_size=*/1, /*streaming_blocks=*/64);
}

// Each list's rows are its blocks' home rows, in row order.
void expect_rows(const SchedulerSide& s, const StepPlan& plan) {
  for (const auto& [blocks, rows] : {std::pair{&plan.stage_blocks, &plan.stage_rows},
                                     std::pair{&plan.writeback_blocks, &plan.writeback_rows}}) {
    ASSERT_EQ(blocks->size(), rows->size());
    for (std::size_t i = 0; i < blocks->size(); ++i) EXPECT_EQ((*rows)[i], s.homes()->row((*blocks)[i]));
    EXPECT_TRUE(std::is_sorted(rows->begin(), rows->end()));
  }
}

TEST(SchedulerSideStreaming, APrefillWritesItsFreshBlocksInConsecutiveRowsAndStagesNone) {
  auto s = streaming_scheduler();
  // A prefill of 10 tokens over blocks 7, 3, 9: new content, so nothing staged;
  // their rows follow the block table, whatever the ids.
  const StepPlan plan = s.build_step({New{"a", {7, 3, 9}, 0, 10}}, {});
  EXPECT_EQ(plan.stage_blocks, (Ids{}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{7, 3, 9}));
  EXPECT_EQ(plan.writeback_rows, (Ids{0, 1, 2}));
}

TEST(SchedulerSideStreaming, DecodeReadsEveryBlockAndWritesOnlyTheLast) {
  auto s = streaming_scheduler();
  s.build_step({New{"a", {7, 3, 9}, 0, 10}}, {});
  // Token 10 goes to block 9 (slot 2): every block is read, block 9 written.
  StepPlan plan = s.build_step({}, {Cached{"a", false, std::nullopt, 10, 1}});
  EXPECT_EQ(plan.stage_blocks, (Ids{7, 3, 9}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{9}));
  expect_rows(s, plan);
  // Token 12 opens a new block (5), appended to the table in the next row;
  // it is written, not staged.
  s.build_step({}, {Cached{"a", false, std::nullopt, 11, 1}});
  plan = s.build_step({}, {Cached{"a", false, Ids{5}, 12, 1}});
  EXPECT_EQ(plan.stage_blocks, (Ids{7, 3, 9}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{5}));
  EXPECT_EQ(plan.writeback_rows, (Ids{3}));
}

TEST(SchedulerSideStreaming, ARequestOutgrowingItsExtentContinuesWhereTheRowsAreFree) {
  auto s = streaming_scheduler();
  s.build_step({New{"a", {7, 3, 9, 1}, 0, 16}}, {});  // rows 0..3: the first extent, full
  s.build_step({New{"b", {20}, 0, 1}}, {});           // rows 4..7 for b
  // a's next extent cannot continue at row 4: it takes the next free run.
  const StepPlan plan = s.build_step({}, {Cached{"a", false, Ids{11}, 16, 1}});
  EXPECT_EQ(plan.writeback_blocks, (Ids{11}));
  EXPECT_EQ(plan.writeback_rows, (Ids{8}));
  EXPECT_EQ(plan.stage_blocks, (Ids{7, 3, 9, 1}));
  expect_rows(s, plan);
}

TEST(SchedulerSideStreaming, ChunkedPrefillReadsTheEarlierChunks) {
  auto s = streaming_scheduler();
  // 16 prompt tokens in two chunks of 6 and 10 over blocks 1, 2, 3, 4.
  StepPlan plan = s.build_step({New{"a", {1, 2}, 0, 6}}, {});
  EXPECT_EQ(plan.stage_blocks, (Ids{}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{1, 2}));
  plan = s.build_step({}, {Cached{"a", false, Ids{3, 4}, 6, 10}});
  EXPECT_EQ(plan.stage_blocks, (Ids{1, 2}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{2, 3, 4}));  // block 2 holds tokens 4..7
  EXPECT_EQ(plan.writeback_rows, (Ids{1, 2, 3}));
}

TEST(SchedulerSideStreaming, ResumedOrUnknownRequestsTakeTheirNewTableWhole) {
  auto s = streaming_scheduler();
  s.build_step({New{"a", {1, 2}, 0, 8}}, {});
  // Preempted and resumed: a fresh table, not appended to the old one. Block 1
  // is vLLM's prefix hit and keeps its row; block 5 is new content.
  StepPlan plan = s.build_step({}, {Cached{"a", true, Ids{1, 5}, 4, 4}});
  EXPECT_EQ(plan.stage_blocks, (Ids{1}));
  EXPECT_EQ(plan.stage_rows, (Ids{0}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{5}));
  expect_rows(s, plan);
  // A running request never seen as new (no table yet) is planned from its
  // ids; a block with no row yet counts as new content.
  plan = s.build_step({}, {Cached{"b", false, Ids{8}, 0, 3}});
  EXPECT_EQ(plan.stage_blocks, (Ids{}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{8}));
  expect_rows(s, plan);
}

TEST(SchedulerSideStreaming, SharedBlocksAreStagedOnceFromTheirOneHome) {
  auto s = streaming_scheduler();
  s.build_step({New{"p", {4}, 0, 4}}, {});  // block 4 gets its content, row 0
  EXPECT_FALSE(s.request_finished("p"));
  // Two requests share it through vLLM's own prefix cache.
  const StepPlan plan = s.build_step({New{"a", {4, 1}, 4, 3}, New{"b", {4, 2}, 4, 4}}, {});
  EXPECT_EQ(plan.stage_blocks, (Ids{4}));
  EXPECT_EQ(plan.stage_rows, (Ids{0}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{1, 2}));
  expect_rows(s, plan);
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
  EXPECT_EQ(plan.stage_blocks, (Ids{}));
  EXPECT_EQ(plan.writeback_blocks, (Ids{5, 6, 7}));
  expect_rows(s, plan);
}

TEST(SchedulerSideStreaming, AFreshBlockLeavesItsOldRowAndFinishedRequestsDropTheirTable) {
  auto s = streaming_scheduler();
  s.build_step({New{"a", {1, 2}, 0, 8}}, {});  // rows 0 and 1 (2 and 3 reserved)
  s.build_step({New{"c", {9}, 0, 1}}, {});     // row 4 (5..7 reserved)
  const std::int64_t old_row = s.homes()->row(2);
  EXPECT_FALSE(s.request_finished("a"));
  // vLLM gives block 2 new content for b: a new row; block 1 keeps its own.
  s.build_step({New{"b", {2}, 0, 3}}, {});
  EXPECT_NE(s.homes()->row(2), old_row);
  EXPECT_EQ(s.homes()->row(1), 0);
  EXPECT_FALSE(s.request_finished("b"));
  // Seen again as running (no table): its new ids are its table.
  const StepPlan plan = s.build_step({}, {Cached{"a", false, Ids{3}, 8, 1}});
  EXPECT_EQ(plan.stage_blocks, (Ids{}));
  EXPECT_TRUE(s.homes()->has_row(3));
}

TEST(SchedulerSideStreaming, TheGeometryIsReportedOnceInTheStatsAsGauges) {
  auto s = SchedulerSide(Config{}, Digest{}, kBlockSize, 64, 16, /*tp_size=*/2, /*streaming_blocks=*/64);
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
  EXPECT_EQ(first.gauge(Gauge::kStreamingStreamedLayers), 15);
  EXPECT_EQ(first.gauge(Gauge::kStreamingDeviceBlocks), 128);
  EXPECT_EQ(first.gauge(Gauge::kStreamingDeviceBlocksWithout), 24);
  // Bytes of every worker: per worker times tp_size.
  EXPECT_EQ(first.gauge(Gauge::kStreamingHostBytes), 2 << 20);
  EXPECT_EQ(first.gauge(Gauge::kStreamingDecodeStepBytes), 2 * 4096);
  for (std::size_t i = 0; i < kCounterNames.size(); ++i) EXPECT_EQ(first.get(static_cast<Counter>(i)), 0);
  EXPECT_TRUE(s.take_telemetry().empty());  // unchanged: not reported again
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
