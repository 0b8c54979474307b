// The shared index as several vLLM instances use it: each instance here is
// its own open of the file (its own open file description, so its own locks,
// as another process's would be); a dead instance is a forked child killed
// with SIGKILL.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <set>
#include <stdexcept>

#include "activekv/shared_block_index.h"
#include "temp_dir.h"

namespace activekv {
namespace {

using Blocks = std::vector<std::pair<BlockKey, std::int64_t>>;

BlockKey k(std::uint8_t i) {
  BlockKey key{};
  key[0] = i;
  key[31] = static_cast<std::uint8_t>(i * 7 + 1);
  return key;
}

struct Store {
  test::TempDir dir{/*in_memory=*/true};
  std::string path = (dir.path / "store.index").string();
  int rebuilds = 0;

  std::unique_ptr<SharedBlockIndex> attach(std::int64_t slots, Blocks sealed = {}) {
    auto ix = SharedBlockIndex::open(path, slots, [&]() -> Result<Blocks> {
      ++rebuilds;
      return sealed;
    });
    if (!ix.ok()) throw std::runtime_error(ix.status().error());
    return std::move(ix.value());
  }
};

void store(StoreIndex& index, std::uint8_t i) { index.commit(*index.reserve(k(i)).slot); }

TEST(SharedBlockIndex, TheFirstInstanceRebuildsFromTheFilesTheOthersJoin) {
  Store s;
  auto a = s.attach(4, {{k(1), 2}, {k(2), 0}});
  EXPECT_FALSE(a->joined());
  EXPECT_EQ(a->restored(), 2);
  auto b = s.attach(4, {{k(9), 1}});
  EXPECT_TRUE(b->joined());
  EXPECT_EQ(s.rebuilds, 1) << "a joining instance must not rebuild the index";
  EXPECT_EQ(b->lookup(k(1)), 2);
  EXPECT_EQ(b->lookup(k(2)), 0);
  EXPECT_FALSE(b->contains(k(9)));
  EXPECT_EQ(a->live_instances(), 2);
  EXPECT_NE(a->instance(), b->instance());
}

TEST(SharedBlockIndex, ABlockSavedByOneIsFoundByTheOthersOnlyOnceCommitted) {
  Store s;
  auto a = s.attach(4);
  auto b = s.attach(4);
  const auto r = a->reserve(k(1));
  ASSERT_TRUE(r.slot);
  EXPECT_TRUE(b->contains(k(1))) << "a pending save is known: b must not save it again";
  EXPECT_FALSE(b->lookup(k(1))) << "a pending save must not be served";
  EXPECT_TRUE(b->reserve(k(1)).stored_elsewhere);
  a->commit(*r.slot);
  EXPECT_EQ(b->lookup(k(1)), *r.slot);
  EXPECT_EQ(b->visible_blocks(), 1);
  EXPECT_THROW(b->commit(*r.slot), std::logic_error);
}

TEST(SharedBlockIndex, EvictionIsGloballyLeastRecentlyUsedAndSparesOtherInstancesPins) {
  Store s;
  auto a = s.attach(3);
  auto b = s.attach(3);
  store(*a, 1);
  store(*b, 2);
  store(*a, 3);
  b->touch(k(1));  // b's use of a's block counts for a's eviction
  const auto first = a->reserve(k(4));
  ASSERT_EQ(first.evicted.size(), 1u);
  EXPECT_EQ(first.evicted[0], k(2));
  a->commit(*first.slot);
  const auto pinned = b->pin(k(3));  // b is loading the oldest now
  ASSERT_TRUE(pinned);
  const auto second = a->reserve(k(5));
  ASSERT_EQ(second.evicted.size(), 1u);
  EXPECT_EQ(second.evicted[0], k(1)) << "b's pin must protect its block from a's eviction";
  EXPECT_EQ(b->lookup(k(3)), *pinned);
  b->unpin(*pinned);
  EXPECT_THROW(b->unpin(*pinned), std::logic_error);
  EXPECT_FALSE(a->pin(k(1))) << "a pin of a block evicted since its lookup must fail, not serve";
}

TEST(SharedBlockIndex, ADeadInstancesPinsAreDroppedAndItsPendingSlotsRetired) {
  Store s;
  auto a = s.attach(3);
  store(*a, 1);
  const pid_t child = ::fork();
  if (child == 0) {  // another vLLM: pins a's block, starts a save, and is killed
    auto c = s.attach(3);
    const bool ok = c->joined() && c->pin(k(1)) && c->reserve(k(2)).slot;
    ::raise(ok ? SIGKILL : SIGTERM);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the child did not pin and reserve";
  EXPECT_EQ(a->live_instances(), 1);
  EXPECT_FALSE(a->contains(k(2))) << "a dead instance's save must be taken over";
  const auto r = a->reserve(k(2));  // the third, free slot
  ASSERT_TRUE(r.slot);
  a->commit(*r.slot);
  const auto evicting = a->reserve(k(3));
  ASSERT_EQ(evicting.evicted.size(), 1u) << "a dead instance's pin must not hold a slot for ever";
  EXPECT_EQ(evicting.evicted[0], k(1));
  a->commit(*evicting.slot);
  // The dead instance's pending slot may still take a late copy from its
  // worker: it is never handed out again, so the two live slots circulate.
  std::set<std::int64_t> used{*r.slot, *evicting.slot};
  for (std::uint8_t i = 4; i < 10; ++i) {
    const auto again = a->reserve(k(i));
    ASSERT_TRUE(again.slot);
    EXPECT_TRUE(used.count(*again.slot)) << "slot " << *again.slot << " was the dead instance's pending save";
    a->commit(*again.slot);
  }
}

TEST(SharedBlockIndex, AnInstanceNeverDiscardsASaveAnotherInstanceStartedInTheSameSlot) {
  Store s;
  auto a = s.attach(1);
  auto b = s.attach(1);
  store(*a, 1);
  const auto slot = *a->lookup(k(1));  // a's failed load would discard this slot...
  const auto r = b->reserve(k(2));     // ...but b evicted the block and is saving into it
  ASSERT_EQ(r.slot, slot);
  a->discard(slot);
  EXPECT_TRUE(b->contains(k(2))) << "a dropped b's save in flight";
  b->commit(*r.slot);
  EXPECT_EQ(a->lookup(k(2)), slot);
}

BlockKey key_of(std::uint32_t n) {
  BlockKey key{};
  std::memcpy(key.data(), &n, sizeof(n));
  key[31] = 0xa5;
  return key;
}

TEST(SharedBlockIndex, AHolderKilledInsideTheLockLeavesAWorkingIndex) {
  Store s;
  constexpr std::int64_t kSlots = 1024;
  auto a = s.attach(kSlots);
  std::vector<std::int64_t> held;
  for (std::uint8_t i = 1; i <= 8; ++i) {  // a's loads in flight: never evicted by the other
    store(*a, i);
    held.push_back(*a->pin(k(i)));
  }
  std::mt19937 rng(5);
  int kills = 0;
  // Many deaths inside the lock: most land between two consistent states, a
  // few in the middle of an update, which only the rebuild repairs.
  constexpr std::uint64_t kDeaths = 60;
  for (; kills < 1200 && a->dead_holders() < kDeaths; ++kills) {
    const pid_t child = ::fork();
    if (child == 0) {  // another vLLM saving and looking up as fast as it can, until killed
      auto b = s.attach(kSlots);
      for (std::uint32_t n = static_cast<std::uint32_t>(kills) << 20;; ++n) {
        const auto r = b->reserve(key_of(n));
        if (r.slot) b->commit(*r.slot);
        (void)b->lookup(key_of(n / 2));
      }
    }
    ::usleep(1000 + static_cast<useconds_t>(rng() % 5000));
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  }
  ASSERT_GE(a->dead_holders(), kDeaths) << "too few kills landed inside the lock in " << kills << " tries";
  for (std::uint8_t i = 1; i <= 8; ++i) EXPECT_EQ(a->lookup(k(i)), held[i - 1]) << static_cast<int>(i);
  // Eviction still walks a sound LRU list: every save into the full index
  // evicts exactly one block, never a pinned one.
  for (std::uint32_t n = 0; n < 2 * kSlots; ++n) {
    const auto r = a->reserve(key_of(0xfff00000u + n));
    ASSERT_TRUE(r.slot) << n;
    ASSERT_LE(r.evicted.size(), 1u);
    a->commit(*r.slot);
  }
  for (std::uint8_t i = 1; i <= 8; ++i) EXPECT_EQ(a->lookup(k(i)), held[i - 1]) << static_cast<int>(i);
  EXPECT_LE(a->visible_blocks(), kSlots);
  EXPECT_EQ(a->occupancy().visible, a->visible_blocks()) << "the header's count drifted from the slots";
}

TEST(SharedBlockIndex, WhenTheLastInstanceLeavesTheNextRebuildsAndAClosedOnesSavesAreDropped) {
  Store s;
  {
    auto a = s.attach(4);
    store(*a, 1);
    auto b = s.attach(4);
    ASSERT_TRUE(b->reserve(k(2)).slot);  // never committed: b closes first
    b.reset();
    EXPECT_FALSE(a->contains(k(2)));
    EXPECT_TRUE(a->contains(k(1)));
  }
  auto c = s.attach(4, {{k(7), 3}});
  EXPECT_FALSE(c->joined());
  EXPECT_EQ(s.rebuilds, 2);
  EXPECT_EQ(c->lookup(k(7)), 3);
  EXPECT_FALSE(c->contains(k(1))) << "the index is made from the files, not from what the last instance left";
}

TEST(SharedBlockIndex, RetiredAndDiscardedSlots) {
  Store s;
  auto a = s.attach(2);
  auto b = s.attach(2);
  const auto r = a->reserve(k(1));
  a->retire(*r.slot);  // a fence of unknown outcome
  EXPECT_FALSE(b->contains(k(1)));
  store(*b, 2);
  const auto full = b->reserve(k(3));  // the retired slot is never handed out
  ASSERT_EQ(full.evicted.size(), 1u);
  EXPECT_EQ(full.evicted[0], k(2));
  b->discard(*full.slot);
  EXPECT_FALSE(a->contains(k(3)));
}

TEST(SharedBlockIndex, OccupancyIsTheWholeStoresOfEveryInstance) {
  Store s;
  auto a = s.attach(4, {{k(9), 3}});
  EXPECT_EQ(a->occupancy().visible, 1);  // restored
  EXPECT_EQ(a->occupancy().free, 3);
  auto b = s.attach(4);
  store(*a, 1);
  const auto r = b->reserve(k(2));  // pending: taken, not visible
  EXPECT_EQ(b->occupancy().visible, 2);
  EXPECT_EQ(b->occupancy().free, 1);
  b->commit(*r.slot);
  a->touch(k(2));  // a use moves it in the LRU list: no count changes
  EXPECT_EQ(a->occupancy().visible, 3);
  a->retire(*a->lookup(k(1)));  // neither visible nor free again
  EXPECT_EQ(a->occupancy().visible, 2);
  EXPECT_EQ(a->occupancy().free, 1);
  b->discard(*b->lookup(k(2)));
  EXPECT_EQ(a->occupancy().visible, 1);
  EXPECT_EQ(a->occupancy().free, 2);
  EXPECT_EQ(a->occupancy().visible, a->visible_blocks());
}

TEST(SharedBlockIndex, ManyRoundsThroughTheTableKeepEveryBlockFindable) {
  Store s;
  auto a = s.attach(8);
  auto b = s.attach(8);
  for (int round = 0; round < 200; ++round) {  // tombstones pile up and the table is made again
    auto& who = round % 2 == 0 ? *a : *b;
    const auto key = static_cast<std::uint8_t>(round);
    if (!who.contains(k(key))) store(who, key);
    EXPECT_TRUE(a->lookup(k(key))) << round;
  }
  EXPECT_EQ(a->visible_blocks(), 8);
  for (int back = 0; back < 8; ++back)
    EXPECT_TRUE(b->lookup(k(static_cast<std::uint8_t>(199 - back)))) << back;
}

TEST(SharedBlockIndex, AStoreOfAnotherSizeIsRefusedWhileInUse) {
  Store s;
  auto a = s.attach(4);
  auto other = SharedBlockIndex::open(s.path, 8, [] { return Result<Blocks>(Blocks{}); });
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().error().find("capacity_bytes"), std::string::npos) << other.status().error();
  EXPECT_NE(other.status().error().find(s.path), std::string::npos);
  auto missing = SharedBlockIndex::open((s.dir.path / "no" / "x.index").string(), 4,
                                        [] { return Result<Blocks>(Blocks{}); });
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().error().find("directory does not exist"), std::string::npos);
}

}  // namespace
}  // namespace activekv
