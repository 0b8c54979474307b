#include <gtest/gtest.h>

#include <stdexcept>

#include "activekv/block_index.h"

namespace activekv {
namespace {

BlockKey k(std::uint8_t i) {
  BlockKey key{};
  key[0] = i;
  return key;
}

void store(BlockIndex& index, std::initializer_list<std::uint8_t> ids) {
  for (const auto i : ids) index.commit(*index.reserve(k(i)).slot);
}

TEST(BlockIndex, InvisibleUntilCommitted) {
  BlockIndex index(4);
  const auto r = index.reserve(k(1));
  ASSERT_TRUE(r.slot);
  EXPECT_TRUE(index.contains(k(1)));
  EXPECT_FALSE(index.lookup(k(1)));
  index.commit(*r.slot);
  EXPECT_EQ(index.lookup(k(1)), r.slot);
}

TEST(BlockIndex, OccupancyCountsVisibleBlocksAndFreeSlots) {
  BlockIndex index(4);
  EXPECT_EQ(index.occupancy().visible, 0);
  EXPECT_EQ(index.occupancy().free, 4);
  store(index, {1, 2});
  const auto pending = index.reserve(k(3));
  EXPECT_EQ(index.occupancy().visible, 2);
  EXPECT_EQ(index.occupancy().free, 1);
  index.retire(*pending.slot);  // neither visible nor free again
  index.discard(*index.lookup(k(1)));
  EXPECT_EQ(index.occupancy().visible, 1);
  EXPECT_EQ(index.occupancy().free, 2);
}

TEST(BlockIndex, EvictsLeastRecentlyUsed) {
  BlockIndex index(3);
  store(index, {1, 2, 3});
  index.touch(k(1));
  const auto r = index.reserve(k(4));
  ASSERT_EQ(r.evicted.size(), 1u);
  EXPECT_EQ(r.evicted[0], k(2));
  EXPECT_FALSE(index.lookup(k(2)));
  EXPECT_TRUE(index.lookup(k(1)));
}

TEST(BlockIndex, NeverEvictsPinnedOrPending) {
  BlockIndex index(2);
  store(index, {1});
  index.reserve(k(2));  // pending
  const auto slot1 = *index.pin(k(1));
  EXPECT_FALSE(index.reserve(k(3)).slot);
  index.unpin(slot1);
  const auto r = index.reserve(k(3));
  ASSERT_EQ(r.evicted.size(), 1u);
  EXPECT_EQ(r.evicted[0], k(1));
}

TEST(BlockIndex, SlotsAreReusedLastFreedFirst) {
  BlockIndex index(3);
  const auto a = *index.reserve(k(1)).slot;
  EXPECT_EQ(a, 0);
  index.discard(a);
  EXPECT_EQ(*index.reserve(k(2)).slot, a);
}

TEST(BlockIndex, BrokenContractsThrow) {
  EXPECT_THROW(BlockIndex(0), std::invalid_argument);
  BlockIndex index(2);
  const auto slot = *index.reserve(k(1)).slot;
  EXPECT_THROW(index.pin(k(1)), std::logic_error);
  EXPECT_THROW(index.unpin(slot), std::logic_error);
  EXPECT_THROW(index.reserve(k(1)), std::logic_error);
  index.commit(slot);
  EXPECT_THROW(index.commit(slot), std::logic_error);
}

// A restart with a store file: the blocks come back visible in their slots,
// in their LRU order (the oldest is evicted first); duplicates and slots out
// of range are skipped, and new blocks take only the free slots.
TEST(BlockIndex, RestoredBlocksAreVisibleInTheirSlotsAndKeepTheirLruOrder) {
  BlockIndex index(4);
  EXPECT_EQ(index.restore({{k(7), 2}, {k(5), 0}, {k(5), 1}, {k(6), 0}, {k(8), 9}}), 2);
  EXPECT_EQ(index.lookup(k(7)), 2);
  EXPECT_EQ(index.lookup(k(5)), 0);
  EXPECT_FALSE(index.contains(k(6)));
  EXPECT_FALSE(index.contains(k(8)));
  const auto a = index.reserve(k(1)), b = index.reserve(k(2));
  ASSERT_TRUE(a.slot && b.slot);
  EXPECT_EQ((std::vector<std::int64_t>{*a.slot, *b.slot}), (std::vector<std::int64_t>{1, 3}));
  index.commit(*a.slot);
  index.commit(*b.slot);
  const auto c = index.reserve(k(3));  // full: the oldest restored block goes first
  ASSERT_EQ(c.evicted.size(), 1u);
  EXPECT_EQ(c.evicted[0], k(7));
  EXPECT_EQ(c.slot, 2);
}

}  // namespace
}  // namespace activekv
