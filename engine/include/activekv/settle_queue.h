// Copies a device runs in issue order, each until its fences settle it: the
// worker's store saves and the layer streamer's write-backs. One stream runs
// them, so a later one cannot be done before an earlier one: they settle
// oldest first, and a check stops at the first still running.
#pragma once

#include <cstddef>
#include <deque>
#include <optional>
#include <utility>

namespace activekv {

template <class Item>
class SettleQueue {
 public:
  void push(Item item) { items_.push_back(std::move(item)); }
  bool empty() const { return items_.empty(); }
  std::size_t size() const { return items_.size(); }

  // From the oldest: `outcome(item, wait)` says done (true), unknown (false:
  // past its deadline, or its fence failed) or, only when not waiting, still
  // running (nullopt). Each item with an outcome goes to `settle(item, done)`
  // and leaves the queue; the first still running stops the check. It waits
  // (`wait` true) where the caller waits, and for the oldest while more than
  // `most_in_flight` remain: a caller that never waits must not grow the queue.
  template <class Outcome, class Settle>
  void settle(bool wait, std::size_t most_in_flight, Outcome&& outcome, Settle&& settle) {
    while (!items_.empty()) {
      const std::optional<bool> done = outcome(items_.front(), wait || items_.size() > most_in_flight);
      if (!done) return;
      Item item = std::move(items_.front());
      items_.pop_front();
      settle(item, *done);
    }
  }

 private:
  std::deque<Item> items_;  // in issue order
};

}  // namespace activekv
