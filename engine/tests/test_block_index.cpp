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
  const auto slot1 = index.pin(k(1));
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

}  // namespace
}  // namespace activekv
