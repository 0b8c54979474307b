// A layer-streaming step's plan (src/step_runs.h), without a device: the
// pieces' order keeps every block with its home row and puts the copy
// engine's long runs first; a write-back splits the same way; blocks written
// back and not staged are found in block order; runs of rows split into pairs
// of runs consecutive in both.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "activekv/step_runs.h"

namespace activekv {
namespace {

using Ids = std::vector<std::int64_t>;

// Rows 5-8 (a run of 4), 20 (alone), 30-31 (a run of 2), as HostArena::runs
// gives them for these rows: offsets into the step's lists.
const Ids kRows{5, 6, 7, 8, 20, 30, 31};
const Ids kBlocks{10, 11, 12, 13, 3, 40, 41};
const std::vector<SlotRun> kRuns{{5, 4, 0}, {20, 1, 4}, {30, 2, 5}};

std::vector<std::pair<std::int64_t, std::int64_t>> pairs(const Ids& blocks, const Ids& rows) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (std::size_t i = 0; i < blocks.size(); ++i) out.emplace_back(blocks[i], rows[i]);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(StepRuns, PiecesTakeTheLongRunsFirstAndKeepEachBlockWithItsRow) {
  const detail::PieceOrder plan = detail::piece_order(kRuns, kBlocks, kRows, /*copy_engine_run=*/2);
  EXPECT_EQ(pairs(plan.blocks, plan.rows), pairs(kBlocks, kRows));
  ASSERT_EQ(plan.copy_engine_runs.size(), 2u);
  EXPECT_EQ(plan.copy_engine_runs[0].first, 5);
  EXPECT_EQ(plan.copy_engine_runs[1].first, 30);
  EXPECT_EQ(plan.run_blocks, 6);
  EXPECT_EQ(plan.blocks, (Ids{10, 11, 12, 13, 40, 41, 3}));
}

TEST(StepRuns, PiecesWithRunsOfOneTakeEveryRowByTheCopyEngine) {
  const detail::PieceOrder plan = detail::piece_order(kRuns, kBlocks, kRows, /*copy_engine_run=*/1);
  EXPECT_EQ(plan.run_blocks, static_cast<std::int64_t>(kBlocks.size()));
  EXPECT_EQ(plan.blocks, kBlocks);
  const detail::PieceOrder none = detail::piece_order(kRuns, kBlocks, kRows, /*copy_engine_run=*/5);
  EXPECT_EQ(none.run_blocks, 0);
  EXPECT_TRUE(none.copy_engine_runs.empty());
  EXPECT_EQ(none.blocks, kBlocks);
}

TEST(StepRuns, AWriteBackSplitsIntoLongRunsAndSingleRows) {
  const detail::WritebackSplit split = detail::split_writeback(kRuns, kBlocks, kRows, /*copy_engine_run=*/2);
  EXPECT_EQ(split.long_blocks, (Ids{10, 11, 12, 13, 40, 41}));
  ASSERT_EQ(split.long_runs.size(), 2u);
  for (const SlotRun& run : split.long_runs) {  // each run's offset is into long_blocks, its rows consecutive
    for (std::int64_t i = 0; i < run.count; ++i) {
      const auto block = split.long_blocks[static_cast<std::size_t>(run.offset + i)];
      const auto at = std::find(kBlocks.begin(), kBlocks.end(), block) - kBlocks.begin();
      EXPECT_EQ(kRows[static_cast<std::size_t>(at)], run.first + i);
    }
  }
  EXPECT_EQ(split.short_blocks, (Ids{3}));
  EXPECT_EQ(split.short_rows, (Ids{20}));
}

TEST(StepRuns, BlocksWrittenBackAndNotStagedComeInBlockOrder) {
  const detail::WrittenOnly some = detail::written_not_staged(/*stage=*/{4, 9}, /*writeback=*/{9, 7, 2});
  EXPECT_EQ(some.blocks, (Ids{2, 7}));
  EXPECT_FALSE(some.all);
  const detail::WrittenOnly all = detail::written_not_staged(/*stage=*/{4, 5}, /*writeback=*/{9, 7, 2});
  EXPECT_EQ(all.blocks, (Ids{2, 7, 9}));
  EXPECT_TRUE(all.all);
  EXPECT_TRUE(detail::written_not_staged({1}, {}).all);
}

TEST(StepRuns, PairRunsSplitWhereTheBlockIdsStopBeingConsecutive) {
  // Rows 5-8 hold blocks 10, 11, 13, 14 (a gap after 11); row 20 block 3;
  // rows 30-31 blocks 41, 40 (descending: two runs).
  const Ids blocks{10, 11, 13, 14, 3, 41, 40};
  const std::vector<detail::PairRun> runs = detail::pair_runs(kRuns, blocks, kRows);
  ASSERT_EQ(runs.size(), 5u);
  std::int64_t covered = 0;
  for (const detail::PairRun& run : runs) {  // every pair in a run is (block + i, row + i), at its offset
    for (std::int64_t i = 0; i < run.count; ++i) {
      const auto k = static_cast<std::size_t>(run.offset + i);
      EXPECT_EQ(blocks[k], run.block + i);
      EXPECT_EQ(kRows[k], run.row + i);
    }
    covered += run.count;
  }
  EXPECT_EQ(covered, static_cast<std::int64_t>(blocks.size()));
  EXPECT_EQ(runs[0].count, 2);
  EXPECT_EQ(runs[1].block, 13);
  EXPECT_EQ(runs[1].row, 7);
  // Consecutive block ids across two runs of rows stay two copies.
  const std::vector<detail::PairRun> apart = detail::pair_runs(kRuns, Ids{0, 1, 2, 3, 4, 5, 6}, kRows);
  EXPECT_EQ(apart.size(), 3u);
}

}  // namespace
}  // namespace activekv
