// HomeRows (home_rows.h): the same cases as the reference's
// tests/reference/test_homes.py, on the native allocator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "activekv/home_rows.h"

namespace activekv {
namespace {

using Ids = std::vector<std::int64_t>;

std::int64_t runs_of(const HomeRows& h, const Ids& blocks) {
  std::int64_t runs = blocks.empty() ? 0 : 1;
  for (std::size_t i = 1; i < blocks.size(); ++i) runs += h.row(blocks[i]) != h.row(blocks[i - 1]) + 1;
  return runs;
}

// Copies a staging of `blocks` takes: runs of consecutive rows whose block ids
// are consecutive too (the stage list is in row order).
std::int64_t copies_of(const HomeRows& h, const Ids& blocks) {
  std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
  for (const auto b : blocks) pairs.emplace_back(h.row(b), b);
  std::sort(pairs.begin(), pairs.end());
  std::int64_t copies = pairs.empty() ? 0 : 1;
  for (std::size_t i = 1; i < pairs.size(); ++i) {
    copies += pairs[i] != std::pair{pairs[i - 1].first + 1, pairs[i - 1].second + 1};
  }
  return copies;
}

// Free runs are maximal and never hold a mapped row; no row serves two blocks.
void check_invariants(const HomeRows& h, const std::set<std::int64_t>& blocks) {
  std::set<std::int64_t> rows;
  for (const auto b : blocks) EXPECT_TRUE(rows.insert(h.row(b)).second) << "a row serves two blocks";
  std::int64_t last_end = -1;
  for (const auto& [start, end] : h.free_runs()) {
    EXPECT_LT(last_end, start) << "free runs must be maximal";
    last_end = end;
    for (auto r = start; r < end; ++r) EXPECT_FALSE(rows.contains(r)) << "mapped row " << r << " is free";
  }
}

TEST(HomeRows, SizesFollowTheCache) {
  EXPECT_EQ(home_extent_for(16), 2);
  EXPECT_EQ(home_extent_for(4096), 64);
  EXPECT_EQ(home_rows_for(16), 20);
  EXPECT_EQ(home_rows_for(65536), 65536 + 4096);
}

TEST(HomeRows, AGrowingRequestKeepsConsecutiveRowsWhateverItsBlockIds) {
  HomeRows h(4096);
  Ids ids(4096);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(1));
  ids.resize(1000);
  h.assign("a", Ids(ids.begin(), ids.begin() + 100));
  for (std::size_t i = 100; i < ids.size(); ++i) h.assign("a", {ids[i]});
  EXPECT_EQ(runs_of(h, ids), 1);
  check_invariants(h, std::set<std::int64_t>(ids.begin(), ids.end()));
}

TEST(HomeRows, InterleavedRequestsEachKeepLongRuns) {
  HomeRows h(4096);
  std::map<std::string, Ids> tables;
  std::int64_t next = 0;
  for (int step = 0; step < 600; ++step) {
    for (const std::string r : {"a", "b", "c", "d"}) {
      const std::int64_t block = (next++ * 2654435761LL) % 4096;  // scattered ids, all distinct
      h.assign(r, {block});
      tables[r].push_back(block);
    }
  }
  for (const auto& [r, table] : tables) EXPECT_LE(runs_of(h, table), 5) << r;
}

TEST(HomeRows, AFreshBlockLeavesItsOldRowAndASharedOneKeepsIt) {
  HomeRows h(64);  // extents of 4
  h.assign("a", {5, 6, 7});
  h.assign("c", {8});
  const Ids old = {h.row(5), h.row(6), h.row(7)};
  h.end_request("a");
  h.assign("b", {7});
  EXPECT_EQ(h.row(5), old[0]);
  EXPECT_EQ(h.row(6), old[1]);
  EXPECT_NE(h.row(7), old[2]);
  bool freed = false;
  for (const auto& [s, e] : h.free_runs()) freed |= s <= old[2] && old[2] < e;
  EXPECT_TRUE(freed);
  check_invariants(h, {5, 6, 7, 8});
}

TEST(HomeRows, WithNoFreeRowTheLargestOtherReservationGivesUpHalf) {
  HomeRows h(16);  // 20 rows, extents of 2
  Ids first8 = {0, 1, 2, 3, 4, 5, 6, 7};
  h.assign("big", first8);
  h.assign("big", {8});
  h.assign("other", {9, 10, 11, 12, 13, 14, 15});
  std::set<std::int64_t> all;
  for (std::int64_t b = 0; b < 16; ++b) all.insert(b);
  check_invariants(h, all);
}

TEST(HomeRows, FragmentationAfterManyRequestsKeepsEveryInvariant) {
  const std::int64_t num_blocks = 512;
  HomeRows h(num_blocks);
  std::mt19937 rng(3);
  Ids free(num_blocks);
  std::iota(free.begin(), free.end(), 0);
  std::shuffle(free.begin(), free.end(), rng);
  std::map<std::string, Ids> live;
  std::set<std::int64_t> mapped;
  double run_sum = 0;
  int finished = 0;
  for (int step = 0; step < 3000; ++step) {
    if (!live.empty() && (rng() % 20 == 0 || free.empty())) {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      run_sum += static_cast<double>(it->second.size()) / static_cast<double>(runs_of(h, it->second));
      ++finished;
      h.end_request(it->first);
      free.insert(free.end(), it->second.rbegin(), it->second.rend());
      live.erase(it);
    } else if (live.size() < 8 && free.size() > 40) {
      Ids fresh(free.begin(), free.begin() + 1 + static_cast<long>(rng() % 30));
      free.erase(free.begin(), free.begin() + static_cast<long>(fresh.size()));
      std::string r = "r";
      r.append(std::to_string(step));
      h.assign(r, fresh);
      live[r] = fresh;
      mapped.insert(fresh.begin(), fresh.end());
    } else {
      for (auto& [r, table] : live) {
        if (free.empty() || rng() % 2) continue;
        h.assign(r, {free.front()});
        table.push_back(free.front());
        mapped.insert(free.front());
        free.erase(free.begin());
      }
    }
    if (step % 100 == 0) check_invariants(h, mapped);
  }
  check_invariants(h, mapped);
  ASSERT_GT(finished, 0);
  EXPECT_GE(run_sum / finished, 4.0);
}

TEST(HomeRows, RunsOfIdsDescendingByOneAreGivenRowsInIdOrder) {
  EXPECT_EQ(in_id_order({9, 8, 7, 3, 4, 5, 2, 1, 10}), (Ids{7, 8, 9, 3, 4, 5, 1, 2, 10}));
  EXPECT_EQ(in_id_order({}), Ids{});
  EXPECT_EQ(in_id_order({4}), Ids{4});
  EXPECT_EQ(in_id_order({6, 5}), (Ids{5, 6}));
}

// vLLM frees a finished request's blocks tail first and hands them to the next
// request in that order: its prefill chunks get ids that run backwards. Each
// chunk's rows ascend with its ids, so it is one copy.
TEST(HomeRows, BlocksHandedOutTailFirstCrossInOneCopyAChunk) {
  HomeRows h(4096);
  Ids first(300);
  std::iota(first.begin(), first.end(), 0);
  for (std::size_t chunk = 0; chunk < 300; chunk += 100) {
    h.assign("first",
             Ids(first.begin() + static_cast<long>(chunk), first.begin() + static_cast<long>(chunk) + 100));
  }
  h.end_request("first");
  Ids free(first.rbegin(), first.rend());  // vLLM's free queue after the request ended
  Ids second;
  for (std::size_t chunk = 0; chunk < 300; chunk += 100) {
    const Ids fresh(free.begin() + static_cast<long>(chunk), free.begin() + static_cast<long>(chunk) + 100);
    h.assign("second", fresh);
    second.insert(second.end(), fresh.begin(), fresh.end());
  }
  check_invariants(h, std::set<std::int64_t>(second.begin(), second.end()));
  EXPECT_EQ(copies_of(h, second), 3);  // rows in block-table order: 300
  Ids rows;
  for (const auto b : second) rows.push_back(h.row(b));
  std::sort(rows.begin(), rows.end());
  EXPECT_EQ(rows.back() - rows.front(), 299);  // still one run of rows
}

// vLLM's free queue (ids in order at start, a finished request's blocks
// appended tail first, new blocks taken from the front) through many long
// requests, prefilled in chunks and decoded a block at a time beside each
// other. The ids fragment; a staging takes about one copy per run of ids
// (0.82 of a run here; rows in block-table order took 0.62).
TEST(HomeRows, ALongRunningServerStagesARunOfIdsInAboutOneCopy) {
  const std::int64_t num_blocks = 4096;
  HomeRows h(num_blocks);
  std::mt19937 rng(5);
  std::deque<std::int64_t> free(num_blocks);
  std::iota(free.begin(), free.end(), 0);
  std::map<std::string, Ids> live;
  std::set<std::int64_t> mapped;
  double per_copy = 0, per_id_run = 0;
  int finished = 0;
  const auto take = [&] {
    const std::int64_t b = free.front();
    free.pop_front();
    mapped.insert(b);
    return b;
  };
  for (int step = 0; step < 4000; ++step) {
    if (!live.empty() && (rng() % 50 == 0 || free.size() < 200)) {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      const Ids& table = it->second;
      std::int64_t id_runs = 1;
      for (std::size_t i = 1; i < table.size(); ++i) id_runs += std::abs(table[i] - table[i - 1]) != 1;
      per_copy += static_cast<double>(table.size()) / static_cast<double>(copies_of(h, table));
      per_id_run += static_cast<double>(table.size()) / static_cast<double>(id_runs);
      ++finished;
      h.end_request(it->first);
      free.insert(free.end(), table.rbegin(), table.rend());
      live.erase(it);
    } else if (live.size() < 4) {
      std::string r = "r";  // (not "r" + to_string: GCC 12's -Wrestrict misfires on it)
      r.append(std::to_string(step));
      const auto chunks = 1 + rng() % 8;  // of 128 blocks (2048 tokens)
      for (std::uint32_t c = 0; c < chunks; ++c) {
        Ids chunk;
        for (int i = 0; i < 128; ++i) chunk.push_back(take());
        h.assign(r, chunk);
        live[r].insert(live[r].end(), chunk.begin(), chunk.end());
      }
    } else {
      for (auto& [r, table] : live) {  // decode: a block now and then
        if (rng() % 10 != 0) continue;
        table.push_back(take());
        h.assign(r, {table.back()});
      }
    }
  }
  check_invariants(h, mapped);
  ASSERT_GT(finished, 50);
  EXPECT_GE(per_copy / finished, 0.7 * per_id_run / finished)
      << per_copy / finished << " " << per_id_run / finished;
}

TEST(HomeRows, ABlockWithoutARowIsOutOfRange) {
  EXPECT_THROW(HomeRows(16).row(3), std::out_of_range);
  EXPECT_FALSE(HomeRows(16).has_row(3));
}

}  // namespace
}  // namespace activekv
