// SettleQueue (activekv/settle_queue.h): items settle oldest first, a check
// stops at the first still running, waits where asked and for the oldest
// beyond the cap, and hands each item its outcome.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "activekv/settle_queue.h"

namespace activekv {
namespace {

// An item whose copy is done, failed, or runs until waited for.
enum class Copy { kDone, kFailed, kRunning };
struct Item {
  int id;
  Copy copy;
};

struct Recorder {
  std::vector<int> settled;
  std::vector<bool> outcomes;
  std::vector<int> waited_for;
  std::optional<bool> outcome(const Item& item, bool wait) {
    if (wait) waited_for.push_back(item.id);
    if (item.copy == Copy::kRunning) return wait ? std::optional<bool>(true) : std::nullopt;
    return item.copy == Copy::kDone;
  }
  void settle(bool wait, std::size_t cap, SettleQueue<Item>& q) {
    q.settle(
        wait, cap, [this](const Item& i, bool w) { return outcome(i, w); },
        [this](const Item& i, bool done) {
          settled.push_back(i.id);
          outcomes.push_back(done);
        });
  }
};

TEST(SettleQueue, SettlesOldestFirstAndStopsAtTheFirstStillRunning) {
  SettleQueue<Item> q;
  for (const Item& i :
       {Item{1, Copy::kDone}, Item{2, Copy::kFailed}, Item{3, Copy::kRunning}, Item{4, Copy::kDone}})
    q.push(i);
  Recorder r;
  r.settle(/*wait=*/false, /*cap=*/10, q);
  EXPECT_EQ(r.settled, (std::vector<int>{1, 2}));
  EXPECT_EQ(r.outcomes, (std::vector<bool>{true, false}));  // a failed copy's outcome is unknown
  EXPECT_TRUE(r.waited_for.empty());
  EXPECT_EQ(q.size(), 2u);  // 4 is done, but behind 3
}

TEST(SettleQueue, WaitsForEveryItemWhereTheCallerWaits) {
  SettleQueue<Item> q;
  q.push({1, Copy::kRunning});
  q.push({2, Copy::kRunning});
  Recorder r;
  r.settle(/*wait=*/true, /*cap=*/10, q);
  EXPECT_EQ(r.settled, (std::vector<int>{1, 2}));
  EXPECT_EQ(r.waited_for, (std::vector<int>{1, 2}));
  EXPECT_TRUE(q.empty());
}

TEST(SettleQueue, BeyondTheCapItWaitsForTheOldestOnly) {
  SettleQueue<Item> q;
  for (int id = 1; id <= 5; ++id) q.push({id, Copy::kRunning});
  Recorder r;
  r.settle(/*wait=*/false, /*cap=*/2, q);
  EXPECT_EQ(r.waited_for, (std::vector<int>{1, 2, 3}));  // five in flight, two allowed
  EXPECT_EQ(r.settled, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(q.size(), 2u);
}

}  // namespace
}  // namespace activekv
