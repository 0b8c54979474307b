#include <gtest/gtest.h>

#include <cstring>

#include "activekv/admission_policy.h"

namespace activekv {
namespace {

constexpr std::int64_t kSlotBytes = 100;
constexpr std::int64_t kBlockSize = 4;

// A distinct key per number (the policy only compares keys).
BlockKey key(std::int64_t i) {
  BlockKey k{};
  std::memcpy(k.data(), &i, sizeof(i));
  return k;
}

Config config(std::int64_t threshold = 1, std::int64_t max_bytes_per_request = 0,
              StoreScope scope = StoreScope::kPrompt) {
  Config c;
  c.store_threshold = threshold;
  c.max_bytes_per_request = max_bytes_per_request;
  c.store_blocks = scope;
  return c;
}

TEST(AdmissionPolicy, ABlockIsAdmittedOnItsThresholdthSighting) {
  AdmissionPolicy policy(config(/*threshold=*/3), kSlotBytes);
  EXPECT_FALSE(policy.admits(key(1)));
  policy.sight(key(1));
  policy.sight(key(1));
  EXPECT_EQ(policy.sightings(key(1)), 2);
  EXPECT_FALSE(policy.admits(key(1)));
  policy.sight(key(1));
  EXPECT_TRUE(policy.admits(key(1)));
}

TEST(AdmissionPolicy, WithThresholdOneABlockIsAdmittedOnceSeenAndNeverUnseen) {
  AdmissionPolicy policy(config(/*threshold=*/1), kSlotBytes);
  EXPECT_FALSE(policy.admits(key(1)));
  policy.sight(key(1));
  EXPECT_TRUE(policy.admits(key(1)));
}

TEST(AdmissionPolicy, EachBlockCountsItsOwnSightings) {
  AdmissionPolicy policy(config(/*threshold=*/2), kSlotBytes);
  policy.sight(key(1));
  policy.sight(key(2));
  policy.sight(key(1));
  EXPECT_TRUE(policy.admits(key(1)));
  EXPECT_FALSE(policy.admits(key(2)));
  EXPECT_EQ(policy.sightings(key(3)), 0);
}

TEST(AdmissionPolicy, TheRequestCapAllowsTheWholeBlocksItsBytesBuy) {
  // 250 bytes buy two blocks of 100: a request may write its first and second.
  AdmissionPolicy policy(config(1, /*max_bytes_per_request=*/250), kSlotBytes);
  EXPECT_TRUE(policy.within_request_cap(0));
  EXPECT_TRUE(policy.within_request_cap(1));
  EXPECT_FALSE(policy.within_request_cap(2));
}

TEST(AdmissionPolicy, ACapBelowOneBlockAdmitsNoBlockOfAnyRequest) {
  AdmissionPolicy policy(config(1, /*max_bytes_per_request=*/99), kSlotBytes);
  EXPECT_FALSE(policy.within_request_cap(0));
}

TEST(AdmissionPolicy, ACapOfZeroMeansNoCap) {
  AdmissionPolicy policy(config(1, /*max_bytes_per_request=*/0), kSlotBytes);
  EXPECT_TRUE(policy.within_request_cap(std::int64_t{1} << 40));
}

TEST(AdmissionPolicy, PromptScopeSavesOnlyThePromptsFullBlocks) {
  AdmissionPolicy policy(config(1, 0, StoreScope::kPrompt), kSlotBytes);
  // 10 prompt tokens fill two blocks of 4; decode filled three more.
  EXPECT_EQ(policy.savable_blocks(/*num_full_blocks=*/5, /*num_prompt_tokens=*/10, kBlockSize), 2);
  // Mid-prefill, fewer blocks are full than the prompt will fill.
  EXPECT_EQ(policy.savable_blocks(1, 10, kBlockSize), 1);
}

TEST(AdmissionPolicy, PromptAndDecodeScopeSavesEveryFullBlock) {
  AdmissionPolicy policy(config(1, 0, StoreScope::kPromptAndDecode), kSlotBytes);
  EXPECT_EQ(policy.savable_blocks(5, 10, kBlockSize), 5);
}

TEST(AdmissionPolicy, TheLeastRecentlySightedBlockIsForgottenPastTheTrackingLimit) {
  AdmissionPolicy policy(config(/*threshold=*/2), kSlotBytes);
  policy.sight(key(-1));
  policy.sight(key(-2));
  // kMaxTrackedSightings - 2 other blocks fill the table; key -2 sighted
  // again leaves key -1 the least recently sighted.
  for (std::int64_t i = 0; i + 2 < static_cast<std::int64_t>(kMaxTrackedSightings); ++i) {
    policy.sight(key(i));
  }
  policy.sight(key(-2));
  EXPECT_EQ(policy.sightings(key(-1)), 1);
  policy.sight(key(1 << 30));  // one more block: the oldest goes
  EXPECT_EQ(policy.sightings(key(-1)), 0);
  EXPECT_EQ(policy.sightings(key(-2)), 2);  // sighted since: kept, and admitted
  EXPECT_TRUE(policy.admits(key(-2)));
  EXPECT_EQ(policy.sightings(key(1 << 30)), 1);
}

}  // namespace
}  // namespace activekv
