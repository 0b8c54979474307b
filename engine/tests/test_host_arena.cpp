#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>

#include "activekv/host_arena.h"
#include "temp_dir.h"

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

TEST(HostArena, AllRunsAreTheRunsOfEverySlotInOrder) {
  HostArena arena(10, 2, 50, /*pin=*/false, /*chunk_bytes=*/300);  // 3 slots a chunk, the last holds one
  std::vector<std::int64_t> every(10);
  for (std::int64_t s = 0; s < 10; ++s) every[static_cast<std::size_t>(s)] = s;
  const auto expected = arena.runs(every);
  const auto all = arena.all_runs();
  ASSERT_EQ(all.size(), expected.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ((std::vector<std::int64_t>{all[i].first, all[i].count, all[i].offset}),
              (std::vector<std::int64_t>{expected[i].first, expected[i].count, expected[i].offset}));
  }
  EXPECT_EQ(all.back().count, 1);
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
  EXPECT_FALSE(arena.holds(3, ""));    // an unsealed slot holds nothing, not even ""
  EXPECT_FALSE(arena.holds(10, "x"));  // out of range
  EXPECT_EQ(arena.sealed_slots(), (std::vector<std::int64_t>{2, 7}));
  arena.lease({7});
  EXPECT_FALSE(arena.holds(7, "x"));
  EXPECT_EQ(arena.sealed_slots(), (std::vector<std::int64_t>{2}));
  EXPECT_THROW(arena.seal(arena.lease({4}), {""}), std::invalid_argument);
}

// -- on a store file (store_file.h): a warm restart ------------------------------

std::shared_ptr<StoreFile> store_file(const std::filesystem::path& path, std::int64_t slots,
                                      std::int64_t layers, std::int64_t layer_bytes, std::int64_t per_chunk) {
  StoreFileOptions o;
  o.path = path.string();
  o.num_slots = slots;
  o.slot_bytes = layers * layer_bytes;
  o.num_layers = layers;
  o.slots_per_chunk = per_chunk;
  o.identity = "model=tiny mode=exact";
  auto f = StoreFile::open(o);
  if (!f.ok()) throw std::runtime_error(f.status().error());
  return std::shared_ptr<StoreFile>(std::move(f.value()));
}

std::string tag_for(std::int64_t slot) {
  std::string t(36, '\0');
  t[0] = static_cast<char>('a' + slot);
  t[35] = 1;  // the TP rank's bytes
  return t;
}

// What slot `slot` holds in layer `layer` when it was saved.
at::Tensor saved_bytes(std::int64_t slot, std::int64_t layer, std::int64_t count, std::int64_t bytes) {
  return (at::arange(count * bytes, at::kLong).reshape({count, bytes}) + 7 * slot + 31 * layer).to(at::kByte);
}

TEST(HostArena, OnAStoreFileSealedSlotsComeBackAfterARestartAndUnsealedOnesDoNot) {
  const test::TempDir dir;
  const auto path = dir.path / "store";
  constexpr std::int64_t kLayers = 3, kBytes = 40;
  {
    HostArena arena(kLayers, kBytes, store_file(path, 10, kLayers, kBytes, 4));
    EXPECT_EQ(arena.slots_per_chunk(), 4);
    EXPECT_TRUE(arena.sealed_slots().empty());
    const SlotLease saved = arena.lease({5, 6});     // one run of chunk 1
    const SlotLease unsealed = arena.lease({0});     // killed before its seal
    const SlotLease quarantined = arena.lease({9});  // a copy of unknown outcome
    for (std::int64_t l = 0; l < kLayers; ++l) {
      arena.run_view(l, SlotRun{5, 2, 0}).value().copy_(saved_bytes(5, l, 2, kBytes));
      arena.run_view(l, SlotRun{0, 1, 0}).value().copy_(saved_bytes(0, l, 1, kBytes));
    }
    ASSERT_TRUE(arena.seal(saved, {tag_for(5), tag_for(6)}).ok());
    arena.quarantine(quarantined);
    EXPECT_THROW((void)arena.seal(unsealed, {"short"}), std::invalid_argument);  // and nothing sealed
  }
  {
    HostArena arena(kLayers, kBytes, store_file(path, 10, kLayers, kBytes, 4));
    EXPECT_EQ(arena.sealed_slots(), (std::vector<std::int64_t>{5, 6}));
    EXPECT_TRUE(arena.holds(5, tag_for(5)));
    EXPECT_TRUE(arena.holds(6, tag_for(6)));
    EXPECT_FALSE(arena.holds(0, tag_for(0)));
    EXPECT_EQ(arena.file()->dropped_writing(), 2);  // slots 0 and 9
    for (std::int64_t l = 0; l < kLayers; ++l) {
      EXPECT_TRUE(at::equal(arena.run_view(l, SlotRun{5, 2, 0}).value(), saved_bytes(5, l, 2, kBytes))) << l;
    }
  }
  // Another arena geometry on the same file is refused, not misread.
  EXPECT_THROW(HostArena(kLayers, kBytes / 2, store_file(path, 10, kLayers, kBytes, 4)),
               std::invalid_argument);
}

TEST(HostArena, TwoArenasOnOneStoreFileSeeEachOthersSealsAndLeases) {
  // Two vLLM instances sharing a store: each its own open of the file (in one
  // process here; the file's locks are per open, as across processes).
  const test::TempDir dir;
  const auto path = dir.path / "store";
  constexpr std::int64_t kLayers = 2, kBytes = 16;
  HostArena a(kLayers, kBytes, store_file(path, 6, kLayers, kBytes, 3));
  HostArena b(kLayers, kBytes, store_file(path, 6, kLayers, kBytes, 3));
  EXPECT_TRUE(b.file()->joined());
  const SlotLease lease = a.lease({4});
  for (std::int64_t l = 0; l < kLayers; ++l)
    a.run_view(l, SlotRun{4, 1, 0}).value().copy_(saved_bytes(4, l, 1, kBytes));
  EXPECT_FALSE(b.holds(4, tag_for(4))) << "a slot being written must not be served by another instance";
  ASSERT_TRUE(a.seal(lease, {tag_for(4)}).ok());
  EXPECT_TRUE(b.holds(4, tag_for(4)));
  EXPECT_EQ(b.sealed_slots(), (std::vector<std::int64_t>{4}));
  for (std::int64_t l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(at::equal(b.run_view(l, SlotRun{4, 1, 0}).value(), saved_bytes(4, l, 1, kBytes))) << l;
  }
  b.lease({4});  // b evicts it to write another block there
  EXPECT_FALSE(a.holds(4, tag_for(4))) << "a slot another instance rewrites must not be served";
}

}  // namespace
}  // namespace activekv
