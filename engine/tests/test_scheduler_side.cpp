#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "activekv/scheduler_side.h"
#include "scheduler_side_testing.h"

namespace activekv {
namespace {

using namespace scheduler_testing;  // NOLINT: the shared helpers of these tests

Config store_config(std::int64_t threshold = 1, StoreScope scope = StoreScope::kPrompt,
                    std::int64_t max_bytes_per_request = 0) {
  Config c;
  c.store_threshold = threshold;
  c.store_blocks = scope;
  c.max_bytes_per_request = max_bytes_per_request;
  return c;
}

// Slots of 64 bytes; `num_slots` of them.
SchedulerSide store(const Config& config = store_config(), std::int64_t num_slots = 16,
                    std::int64_t tp_size = 1) {
  return SchedulerSide(config, Digest{}, kBlockSize, /*slot_bytes=*/64, num_slots, tp_size);
}

// vLLM's calls for a request that arrives with `prompt` and is prefilled whole
// in one step over `blocks`, past what the store matched; returns the step's
// plan. `matched` receives the tokens the store offered.
StepPlan prefill(SchedulerSide& s, const std::string& id, const Ids& prompt, const Ids& blocks,
                 const std::optional<std::string>& salt = std::nullopt, std::int64_t* matched = nullptr) {
  s.observe_request(id, salt, static_cast<std::int64_t>(prompt.size()), prompt);
  const std::int64_t hit = s.get_num_new_matched_tokens(id, 0);
  if (matched != nullptr) *matched = hit;
  s.update_state_after_alloc(id, blocks, hit);
  return s.build_step({New{id, blocks, hit, static_cast<std::int64_t>(prompt.size()) - hit}}, {});
}

Ids slots_of(const std::vector<SaveOp>& saves) {
  Ids out;
  for (const auto& op : saves) out.push_back(op.slot);
  return out;
}
Ids blocks_of(const std::vector<SaveOp>& saves) {
  Ids out;
  for (const auto& op : saves) out.push_back(op.block_id);
  return out;
}

WorkerReport saved(const StepPlan& plan) {
  WorkerReport r;
  r.saved = slots_of(plan.saves);
  return r;
}

TEST(SchedulerSide, APromptsFullBlocksAreSavedFromTheDeviceBlocksHoldingThem) {
  auto s = store();
  // 10 tokens over blocks 7, 3, 9: two full blocks; block 9 is not full.
  const StepPlan plan = prefill(s, "a", tokens(10), {7, 3, 9});
  EXPECT_EQ(blocks_of(plan.saves), (Ids{7, 3}));
  ASSERT_EQ(plan.saves.size(), 2u);
  EXPECT_NE(plan.saves[0].slot, plan.saves[1].slot);
  EXPECT_EQ(plan.saves[0].req_id, "a");
  EXPECT_NE(plan.saves[0].key, plan.saves[1].key);
  EXPECT_TRUE(plan.loads.empty());
}

// A hit of at least async_load_min_tokens loads asynchronously, apart from the
// step's loads and named by its request; a shorter one loads in its step.
TEST(SchedulerSide, LongHitsLoadAsynchronouslyShortOnesInTheirStep) {
  Config config = store_config();
  config.async_load_min_tokens = 2 * kBlockSize;
  auto s = store(config);
  s.apply_report(saved(prefill(s, "a", tokens(4 * kBlockSize), {0, 1, 2, 3})));
  // Three full blocks below the one holding the last prompt token.
  s.observe_request("long", std::nullopt, 4 * kBlockSize, tokens(4 * kBlockSize));
  EXPECT_EQ(s.get_num_new_matched_tokens("long", 0), 3 * kBlockSize);
  EXPECT_TRUE(s.loads_async("long"));
  s.update_state_after_alloc("long", Ids{4, 5, 6, 7}, 3 * kBlockSize);
  // vLLM schedules no token of it this step.
  const StepPlan plan = s.build_step({}, {});
  EXPECT_TRUE(plan.loads.empty());
  ASSERT_EQ(plan.async_loads.size(), 1u);
  EXPECT_EQ(plan.async_loads[0].req_id, "long");
  Ids blocks;
  for (const auto& op : plan.async_loads[0].loads) blocks.push_back(op.block_id);
  EXPECT_EQ(blocks, (Ids{4, 5, 6}));
  // One block of hit: under the threshold.
  s.observe_request("short", std::nullopt, 2 * kBlockSize, tokens(2 * kBlockSize));
  EXPECT_EQ(s.get_num_new_matched_tokens("short", 0), kBlockSize);
  EXPECT_FALSE(s.loads_async("short"));
  // A lookup past a partial block matches nothing and loads nothing asynchronously.
  EXPECT_EQ(s.get_num_new_matched_tokens("long", 1), 0);
  EXPECT_FALSE(s.loads_async("long"));
}

TEST(SchedulerSide, ASavedPrefixIsOfferedOnlyOnceItsSaveWasReported) {
  auto s = store();
  const StepPlan first = prefill(s, "a", tokens(10), {7, 3, 9});
  // The save is in flight: the same prompt finds nothing yet.
  std::int64_t matched = -1;
  const StepPlan again = prefill(s, "b", tokens(10), {1, 2, 4}, std::nullopt, &matched);
  EXPECT_EQ(matched, 0);
  EXPECT_TRUE(again.saves.empty());  // being stored already: not saved twice
  s.apply_report(saved(first));
  s.observe_request("c", std::nullopt, 10, tokens(10));
  EXPECT_EQ(s.get_num_new_matched_tokens("c", 0), 8);
}

TEST(SchedulerSide, AStoredPrefixLoadsFromTheSlotsItWasSavedToIntoTheNewBlocks) {
  auto s = store();
  const StepPlan first = prefill(s, "a", tokens(10), {7, 3, 9});
  s.apply_report(saved(first));
  std::int64_t matched = 0;
  const StepPlan plan = prefill(s, "b", tokens(10), {5, 6, 8}, std::nullopt, &matched);
  EXPECT_EQ(matched, 8);
  ASSERT_EQ(plan.loads.size(), 2u);
  EXPECT_EQ(plan.loads[0].block_id, 5);
  EXPECT_EQ(plan.loads[1].block_id, 6);
  EXPECT_EQ(plan.loads[0].slot, first.saves[0].slot);
  EXPECT_EQ(plan.loads[1].slot, first.saves[1].slot);
  EXPECT_EQ(plan.loads[0].key, first.saves[0].key);
  EXPECT_TRUE(plan.saves.empty());  // stored already
  const Telemetry t = s.take_telemetry();
  EXPECT_EQ(t.get(Counter::kLookups), 2);
  EXPECT_EQ(t.get(Counter::kHitBlocks), 2);
  EXPECT_EQ(t.get(Counter::kHitTokens), 8);
  EXPECT_EQ(t.get(Counter::kStoredBlocks), 2);
}

TEST(SchedulerSide, TheStoreGaugesFollowTheIndexAndAreReportedWhenTheyChange) {
  auto s = store(store_config(), /*num_slots=*/16, /*tp_size=*/2);
  const double slot = 64 * 2;  // a slot's bytes on every worker
  const Telemetry start = s.take_telemetry();
  EXPECT_EQ(start.seq(), 1u);
  EXPECT_EQ(start.gauge(Gauge::kStoreCapacityBytes), 16 * slot);
  EXPECT_EQ(start.gauge(Gauge::kStoreFreeBytes), 16 * slot);
  EXPECT_EQ(start.gauge(Gauge::kStoreUsedBytes), 0);
  EXPECT_EQ(start.gauge(Gauge::kStoreBlocks), 0);
  EXPECT_FALSE(start.gauge(Gauge::kStoreHitRatio));  // nothing looked up yet
  const Telemetry idle = s.take_telemetry();
  EXPECT_TRUE(idle.empty());
  EXPECT_EQ(idle.seq(), 2u);

  // Two saves in flight: their slots are taken, no block is visible yet.
  const StepPlan first = prefill(s, "a", tokens(10), {7, 3, 9});
  Telemetry t = s.take_telemetry();
  EXPECT_EQ(t.gauge(Gauge::kStoreUsedBytes), 2 * slot);
  EXPECT_EQ(t.gauge(Gauge::kStoreFreeBytes), 14 * slot);
  EXPECT_FALSE(t.gauge(Gauge::kStoreCapacityBytes));  // unchanged
  EXPECT_FALSE(t.gauge(Gauge::kStoreBlocks));
  EXPECT_EQ(t.get(Counter::kLookupTokens), 8);  // blocks 0 and 1; block 2 holds the last token
  EXPECT_EQ(t.gauge(Gauge::kStoreHitRatio), 0.0);
  // Sealed by one rank of two: still not visible; by both: visible.
  s.apply_report(saved(first));
  EXPECT_FALSE(s.take_telemetry().gauge(Gauge::kStoreBlocks));
  s.apply_report(saved(first));
  EXPECT_EQ(s.take_telemetry().gauge(Gauge::kStoreBlocks), 2);

  // The same prompt again: 8 of its 8 lookup tokens hit; 8 of 16 since start-up.
  prefill(s, "b", tokens(10), {5, 6, 8});
  t = s.take_telemetry();
  EXPECT_EQ(t.get(Counter::kLookupTokens), 8);
  EXPECT_EQ(t.get(Counter::kHitTokens), 8);
  EXPECT_EQ(t.gauge(Gauge::kStoreHitRatio), 0.5);
}

TEST(SchedulerSide, ALookupOffABlockBoundaryLooksUpNoTokens) {
  auto s = store();
  s.observe_request("a", std::nullopt, 13, tokens(13));
  EXPECT_EQ(s.get_num_new_matched_tokens("a", 4), 0);
  s.update_state_after_alloc("a", Ids{1, 2, 3, 4}, 0);
  EXPECT_EQ(s.take_telemetry().get(Counter::kLookupTokens), 8);  // blocks 1 and 2
  s.observe_request("b", std::nullopt, 13, tokens(13, 900));
  EXPECT_EQ(s.get_num_new_matched_tokens("b", 5), 0);
  s.update_state_after_alloc("b", Ids{1, 2, 3, 4}, 0);
  const Telemetry t = s.take_telemetry();
  EXPECT_EQ(t.get(Counter::kLookups), 1);
  EXPECT_EQ(t.get(Counter::kLookupTokens), 0);
}

TEST(SchedulerSide, TheBlockHoldingTheLastPromptTokenIsAlwaysComputed) {
  auto s = store();
  s.apply_report(saved(prefill(s, "a", tokens(8), {1, 2})));
  // Both blocks are stored, but vLLM must compute the last prompt token.
  s.observe_request("b", std::nullopt, 8, tokens(8));
  EXPECT_EQ(s.get_num_new_matched_tokens("b", 0), 4);
}

TEST(SchedulerSide, LookupsStartAtVllmsOwnPrefixAndOnlyOnABlockBoundary) {
  auto s = store();
  s.apply_report(saved(prefill(s, "a", tokens(13), {1, 2, 3, 4})));
  s.observe_request("b", std::nullopt, 13, tokens(13));
  EXPECT_EQ(s.get_num_new_matched_tokens("b", 4), 8);  // blocks 1 and 2 past vLLM's block 0
  EXPECT_EQ(s.get_num_new_matched_tokens("b", 5), 0);  // mid-block: nothing
  // A prompt that differs in its second block matches only its first.
  Ids other = tokens(13);
  other[5] = 0;
  s.observe_request("c", std::nullopt, 13, other);
  EXPECT_EQ(s.get_num_new_matched_tokens("c", 0), 4);
}

TEST(SchedulerSide, AnotherTenantsSaltNeverMatches) {
  auto s = store();
  s.apply_report(saved(prefill(s, "a", tokens(10), {7, 3, 9}, std::string("tenant-1"))));
  s.observe_request("b", std::string("tenant-2"), 10, tokens(10));
  EXPECT_EQ(s.get_num_new_matched_tokens("b", 0), 0);
  s.observe_request("c", std::nullopt, 10, tokens(10));
  EXPECT_EQ(s.get_num_new_matched_tokens("c", 0), 0);
  s.observe_request("d", std::string("tenant-1"), 10, tokens(10));
  EXPECT_EQ(s.get_num_new_matched_tokens("d", 0), 8);
}

TEST(SchedulerSide, WithTensorParallelismASaveIsVisibleOnceEveryRankReportedIt) {
  auto s = store(store_config(), 16, /*tp_size=*/2);
  const StepPlan plan = prefill(s, "a", tokens(10), {7, 3, 9});
  s.apply_report(saved(plan));  // rank 0 only
  s.observe_request("b", std::nullopt, 10, tokens(10));
  EXPECT_EQ(s.get_num_new_matched_tokens("b", 0), 0);
  // vLLM merges the two ranks' reports of one step into one.
  WorkerReport both = saved(plan);
  both.merge(saved(plan));
  auto t = store(store_config(), 16, /*tp_size=*/2);
  const StepPlan plan_t = prefill(t, "a", tokens(10), {7, 3, 9});
  ASSERT_EQ(slots_of(plan_t.saves), slots_of(plan.saves));
  t.apply_report(both);
  t.observe_request("b", std::nullopt, 10, tokens(10));
  EXPECT_EQ(t.get_num_new_matched_tokens("b", 0), 8);
  // The second rank's report, a step later, completes the first store's save.
  s.apply_report(saved(plan));
  EXPECT_EQ(s.get_num_new_matched_tokens("b", 0), 8);
}

TEST(SchedulerSide, MergingReportsKeepsEveryFieldOfBoth) {
  WorkerReport a{{1}, {2}, {3}, {4}, {5}};
  const WorkerReport b{{11}, {12}, {13}, {14}, {15}};
  a.merge(b);
  EXPECT_EQ(a.saved, (Ids{1, 11}));
  EXPECT_EQ(a.failed_saves, (Ids{2, 12}));
  EXPECT_EQ(a.loaded, (Ids{3, 13}));
  EXPECT_EQ(a.failed_loads, (Ids{4, 14}));
  EXPECT_EQ(a.quarantined, (Ids{5, 15}));
  a.merge(WorkerReport{});
  EXPECT_EQ(a.saved, (Ids{1, 11}));
}

TEST(SchedulerSide, AFailedSaveIsForgottenAndSavedAgainNextTime) {
  auto s = store();
  const StepPlan first = prefill(s, "a", tokens(10), {7, 3, 9});
  WorkerReport failed;
  failed.failed_saves = slots_of(first.saves);
  s.apply_report(failed);
  std::int64_t matched = -1;
  const StepPlan again = prefill(s, "b", tokens(10), {1, 2, 4}, std::nullopt, &matched);
  EXPECT_EQ(matched, 0);
  EXPECT_EQ(blocks_of(again.saves), (Ids{1, 2}));
}

TEST(SchedulerSide, AQuarantinedSlotIsNeverUsedAgain) {
  auto s = store(store_config(), /*num_slots=*/2);
  const StepPlan first = prefill(s, "a", tokens(8), {1, 2});
  ASSERT_EQ(first.saves.size(), 2u);
  WorkerReport report;
  report.saved = {first.saves[0].slot};
  report.quarantined = {first.saves[1].slot};
  s.apply_report(report);
  EXPECT_EQ(s.take_telemetry().get(Counter::kQuarantinedFences), 1);
  // Two new blocks, one usable slot: the visible block is evicted for the
  // first; the second finds no slot.
  const StepPlan next = prefill(s, "b", tokens(8, 500), {3, 4});
  EXPECT_EQ(slots_of(next.saves), (Ids{first.saves[0].slot}));
  const Telemetry t = s.take_telemetry();
  EXPECT_EQ(t.get(Counter::kEvictedBlocks), 1);
  EXPECT_EQ(t.get(Counter::kRejectedFull), 1);
}

TEST(SchedulerSide, ABlockIsSavedOnlyOnItsThresholdthSighting) {
  auto s = store(store_config(/*threshold=*/2));
  EXPECT_TRUE(prefill(s, "a", tokens(10), {7, 3, 9}).saves.empty());
  EXPECT_EQ(s.take_telemetry().get(Counter::kRejectedThreshold), 2);
  EXPECT_EQ(blocks_of(prefill(s, "b", tokens(10), {1, 2, 4}).saves), (Ids{1, 2}));
}

TEST(SchedulerSide, TheRequestCapStopsARequestsSavesAfterItsBlocks) {
  auto s = store(store_config(1, StoreScope::kPrompt, /*max_bytes_per_request=*/64));
  EXPECT_EQ(blocks_of(prefill(s, "a", tokens(13), {1, 2, 3, 4}).saves), (Ids{1}));
  EXPECT_EQ(s.take_telemetry().get(Counter::kRejectedRequestCap), 2);
}

TEST(SchedulerSide, BlocksWithSavesInFlightAreNeverEvicted) {
  auto s = store(store_config(), /*num_slots=*/1);
  EXPECT_EQ(blocks_of(prefill(s, "a", tokens(8), {1, 2}).saves), (Ids{1}));
  EXPECT_EQ(s.take_telemetry().get(Counter::kRejectedFull), 1);
}

TEST(SchedulerSide, ABlockBeingLoadedIsNotEvictedUntilEveryRankLoadedIt) {
  auto s = store(store_config(), /*num_slots=*/2, /*tp_size=*/2);
  const StepPlan first = prefill(s, "a", tokens(9), {1, 2, 3});
  WorkerReport both = saved(first);
  both.merge(saved(first));
  s.apply_report(both);
  const StepPlan load = prefill(s, "b", tokens(9), {4, 5, 6});
  ASSERT_EQ(load.loads.size(), 2u);
  // Both slots pinned by the loads: another prompt's blocks find no slot.
  EXPECT_TRUE(prefill(s, "c", tokens(9, 500), {7, 8, 9}).saves.empty());
  WorkerReport loaded;
  for (const auto& op : load.loads) loaded.loaded.push_back(op.slot);
  s.apply_report(loaded);  // one rank: still pinned
  EXPECT_TRUE(prefill(s, "d", tokens(9, 600), {10, 11, 12}).saves.empty());
  s.apply_report(loaded);  // the other rank: free to evict
  EXPECT_EQ(prefill(s, "e", tokens(9, 700), {13, 14, 15}).saves.size(), 2u);
}

TEST(SchedulerSide, AFinishedRequestKeepsItsBlocksUntilItsSavesAreReported) {
  auto s = store();
  const StepPlan plan = prefill(s, "a", tokens(10), {7, 3, 9});
  EXPECT_TRUE(s.request_finished("a"));  // vLLM must not free blocks 7 and 3 yet
  EXPECT_TRUE(s.has_pending_work());
  s.apply_report(saved(plan));
  const StepPlan next = s.build_step({}, {});
  EXPECT_EQ(next.awaiting_free, (std::vector<std::string>{"a"}));
  EXPECT_FALSE(s.has_pending_work());
  EXPECT_TRUE(s.build_step({}, {}).empty());  // said once
}

TEST(SchedulerSide, AFinishedRequestWithNoSaveInFlightFreesItsBlocksAtOnce) {
  auto s = store();
  const StepPlan plan = prefill(s, "a", tokens(10), {7, 3, 9});
  s.apply_report(saved(plan));
  EXPECT_FALSE(s.request_finished("a"));
  EXPECT_FALSE(s.request_finished("never-seen"));
  EXPECT_FALSE(s.has_pending_work());
}

TEST(SchedulerSide, PromptScopeSavesNoDecodeBlock) {
  auto s = store(store_config(1, StoreScope::kPrompt));
  EXPECT_EQ(blocks_of(prefill(s, "a", tokens(6), {1, 2}).saves), (Ids{1}));
  EXPECT_FALSE(s.wants_tokens("a", 8));  // no token past the prompt is needed
  s.observe_request("a", std::nullopt, 6, Ids{900, 901});
  EXPECT_TRUE(s.build_step({}, {Cached{"a", false, std::nullopt, 6, 2}}).saves.empty());
}

TEST(SchedulerSide, PromptAndDecodeScopeSavesADecodeBlockOnceItIsFull) {
  auto s = store(store_config(1, StoreScope::kPromptAndDecode));
  EXPECT_EQ(blocks_of(prefill(s, "a", tokens(6), {1, 2}).saves), (Ids{1}));
  // Token 6 is decoded: block 2 holds 3 of 4.
  EXPECT_TRUE(s.wants_tokens("a", 7));
  s.observe_request("a", std::nullopt, 6, Ids{900});
  EXPECT_FALSE(s.wants_tokens("a", 7));
  EXPECT_TRUE(s.build_step({}, {Cached{"a", false, std::nullopt, 6, 1}}).saves.empty());
  // Token 7 fills it.
  s.observe_request("a", std::nullopt, 6, Ids{901});
  EXPECT_EQ(blocks_of(s.build_step({}, {Cached{"a", false, std::nullopt, 7, 1}}).saves), (Ids{2}));
}

TEST(SchedulerSide, AResumedRequestSavesFromItsNewBlockTable) {
  auto s = store();
  // Chunked prefill of 8 tokens: the first chunk of 4 fills block 10.
  s.observe_request("a", std::nullopt, 8, tokens(8));
  s.update_state_after_alloc("a", {}, s.get_num_new_matched_tokens("a", 0));
  EXPECT_EQ(blocks_of(s.build_step({New{"a", {10, 11}, 0, 4}}, {}).saves), (Ids{10}));
  // Preempted, then resumed in blocks 20 and 21 from scratch: the second
  // block is saved from 21, not from 11 of the old table.
  const StepPlan plan = s.build_step({}, {Cached{"a", true, Ids{20, 21}, 0, 8}});
  EXPECT_EQ(blocks_of(plan.saves), (Ids{21}));
}

TEST(SchedulerSide, UnknownRequestsArePlannedNothing) {
  auto s = store();
  const StepPlan plan = s.build_step({New{"x", {1, 2}, 0, 8}}, {Cached{"y", false, Ids{3}, 8, 1}});
  EXPECT_TRUE(plan.empty());
  EXPECT_FALSE(s.wants_tokens("x", 8));
  EXPECT_EQ(s.known_tokens("x"), 0);
}

}  // namespace
}  // namespace activekv
