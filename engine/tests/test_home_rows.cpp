// HomeRows (home_rows.h): the same cases as the reference's
// tests/reference/test_homes.py, on the native allocator.
#include <gtest/gtest.h>

#include <algorithm>
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

TEST(HomeRows, ABlockWithoutARowIsOutOfRange) {
  EXPECT_THROW(HomeRows(16).row(3), std::out_of_range);
  EXPECT_FALSE(HomeRows(16).has_row(3));
}

}  // namespace
}  // namespace activekv
