#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "activekv/host_arena.h"

namespace activekv {
namespace {

TEST(HostArena, RunsSplitAtGapsAndChunkEdges) {
  HostArena arena(10, 2, 50, /*pin=*/false, /*chunk_bytes=*/300);  // 3 slots per chunk
  ASSERT_EQ(arena.slots_per_chunk(), 3);
  const auto runs = arena.runs({0, 1, 2, 3, 4, 7, 6});
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ((std::vector<std::int64_t>{runs[0].first, runs[0].count, runs[0].offset}),
            (std::vector<std::int64_t>{0, 3, 0}));
  EXPECT_EQ((std::vector<std::int64_t>{runs[1].first, runs[1].count, runs[1].offset}),
            (std::vector<std::int64_t>{3, 2, 3}));
  EXPECT_EQ(runs[2].first, 7);
  EXPECT_EQ(runs[3].first, 6);
}

TEST(HostArena, ChunksAllocatedOnFirstUseAndBounded) {
  HostArena arena(10, 2, 50, false, 300);
  EXPECT_EQ(arena.allocated_chunks(), 0);
  auto v = arena.run_view(1, SlotRun{4, 2, 0});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v.value().sizes(), (std::vector<std::int64_t>{2, 50}));
  EXPECT_TRUE(v.value().is_contiguous());
  EXPECT_EQ(arena.allocated_chunks(), 1);
}

TEST(HostArena, AllocateAllAllocatesEveryChunkOnce) {
  HostArena arena(10, 2, 50, false, 300);  // 3 slots a chunk: 4 chunks
  ASSERT_TRUE(arena.allocate_all().ok());
  EXPECT_EQ(arena.allocated_chunks(), arena.num_chunks());
  EXPECT_EQ(arena.num_chunks(), 4);
  auto before = arena.chunk_view(0, 3).value().data_ptr();
  ASSERT_TRUE(arena.allocate_all().ok());  // already there: nothing moves
  EXPECT_EQ(arena.chunk_view(0, 3).value().data_ptr(), before);
}

TEST(HostArena, SlotDataIsLayerAfterLayer) {
  HostArena arena(4, 2, 3, false);
  arena.run_view(0, SlotRun{1, 1, 0}).value().fill_(7);
  arena.run_view(1, SlotRun{1, 1, 0}).value().fill_(9);
  EXPECT_EQ(arena.slot_data(1).value(), std::string("\x07\x07\x07\x09\x09\x09"));
}

TEST(HostArena, OutOfRangeAndCrossChunkRunsAreErrors) {
  HostArena arena(10, 2, 50, false, 300);
  const auto bad = arena.run_view(0, SlotRun{9, 2, 0});
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().error_code(), ErrorCode::kOutOfRange);
  EXPECT_FALSE(arena.run_view(0, SlotRun{2, 2, 0}).ok());  // spans two chunks
}

TEST(HostArena, LeaseSealsOnlyAtItsGeneration) {
  HostArena arena(10, 2, 50, false, 300);
  const SlotLease first = arena.lease({3, 4});
  ASSERT_TRUE(arena.seal(first, {"a", "b"}).ok());
  EXPECT_EQ(arena.tag(3), "a");
  EXPECT_EQ(arena.tag(4), "b");

  const SlotLease second = arena.lease({4});  // unseals slot 4 at once
  EXPECT_FALSE(arena.tag(4));
  EXPECT_EQ(arena.tag(3), "a");
  const SlotLease third = arena.lease({4});  // slot 4 taken again: second is stale
  const Status stale = arena.seal(second, {"c"});
  EXPECT_EQ(stale.error_code(), ErrorCode::kStale);
  EXPECT_NE(stale.error().find("slot 4"), std::string::npos);
  EXPECT_FALSE(arena.tag(4));
  ASSERT_TRUE(arena.seal(third, {"d"}).ok());
  EXPECT_EQ(arena.tag(4), "d");
}

TEST(HostArena, QuarantinedLeaseNeverSealsAndItsSlotsAreNeverLeased) {
  HostArena arena(10, 2, 50, false, 300);
  ASSERT_TRUE(arena.seal(arena.lease({5}), {"old"}).ok());
  const SlotLease lease = arena.lease({5, 6});
  arena.quarantine(lease);
  EXPECT_EQ(arena.quarantined_count(), 2);
  EXPECT_TRUE(arena.quarantined(5));
  EXPECT_FALSE(arena.quarantined(7));
  EXPECT_EQ(arena.seal(lease, {"x", "y"}).error_code(), ErrorCode::kStale);
  EXPECT_FALSE(arena.tag(5));  // neither the old bytes nor the new are served
  EXPECT_THROW(arena.lease({6}), std::logic_error);
  arena.quarantine(lease);  // a slot is counted once
  EXPECT_EQ(arena.quarantined_count(), 2);
}

TEST(HostArena, ChunksGrowWithTheLayerCountUpToTheirBound) {
  EXPECT_EQ(chunk_bytes_for(4), kDefaultChunkBytes);
  EXPECT_EQ(chunk_bytes_for(16), std::int64_t{128} << 20);  // 8 MiB a layer
  EXPECT_EQ(chunk_bytes_for(32), kMaxChunkBytes);
  EXPECT_EQ(chunk_bytes_for(80), kMaxChunkBytes);
}

TEST(HostArena, HoldsAndSealedSlotsFollowSealsAndLeases) {
  HostArena arena(10, 2, 50, false, 300);
  ASSERT_TRUE(arena.seal(arena.lease({7, 2}), {"x", "y"}).ok());
  EXPECT_TRUE(arena.holds(7, "x"));
  EXPECT_FALSE(arena.holds(7, "y"));
  EXPECT_FALSE(arena.holds(3, ""));  // an unsealed slot holds nothing, not even ""
  EXPECT_FALSE(arena.holds(10, "x"));  // out of range
  EXPECT_EQ(arena.sealed_slots(), (std::vector<std::int64_t>{2, 7}));
  arena.lease({7});
  EXPECT_FALSE(arena.holds(7, "x"));
  EXPECT_EQ(arena.sealed_slots(), (std::vector<std::int64_t>{2}));
  EXPECT_THROW(arena.seal(arena.lease({4}), {""}), std::invalid_argument);
}

}  // namespace
}  // namespace activekv
