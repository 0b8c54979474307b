#include "activekv/home_rows.h"

#include <algorithm>
#include <stdexcept>

namespace activekv {

std::int64_t home_extent_for(std::int64_t num_blocks) {
  return std::max<std::int64_t>(2, std::min<std::int64_t>(64, num_blocks / 16));
}

std::int64_t home_rows_for(std::int64_t num_blocks) {
  return num_blocks + std::max(num_blocks / 16, 2 * home_extent_for(num_blocks));
}

std::vector<std::int64_t> in_id_order(const std::vector<std::int64_t>& blocks) {
  std::vector<std::int64_t> out;
  out.reserve(blocks.size());
  std::size_t start = 0;  // of the run of ids descending by one that ends at i
  for (std::size_t i = 1; i <= blocks.size(); ++i) {
    if (i < blocks.size() && blocks[i] == blocks[i - 1] - 1) continue;
    out.insert(out.end(), blocks.rbegin() + static_cast<std::ptrdiff_t>(blocks.size() - i),
               blocks.rend() - static_cast<std::ptrdiff_t>(start));
    start = i;
  }
  return out;
}

HomeRows::HomeRows(std::int64_t num_blocks)
    : num_rows_(home_rows_for(num_blocks)), extent_(home_extent_for(num_blocks)) {
  free_.emplace(0, num_rows_);
}

void HomeRows::assign(const std::string& req_id, const std::vector<std::int64_t>& fresh_blocks) {
  for (const auto block : fresh_blocks) {
    const auto it = row_of_.find(block);
    if (it == row_of_.end()) continue;
    const std::int64_t row = it->second;
    row_of_.erase(it);
    give_back(row, row + 1);
  }
  const std::vector<std::int64_t> order = in_id_order(fresh_blocks);
  for (std::size_t i = 0; i < order.size(); ++i) {
    auto it = extents_.find(req_id);
    Extent* ext = it == extents_.end() ? nullptr : &it->second;
    if (ext == nullptr || ext->next == ext->end) {
      ext = &new_extent(req_id, static_cast<std::int64_t>(order.size() - i));
    }
    row_of_[order[i]] = ext->next++;
    ++held_[req_id];
  }
}

void HomeRows::end_request(const std::string& req_id) {
  const auto it = extents_.find(req_id);
  if (it != extents_.end()) {
    if (it->second.next < it->second.end) give_back(it->second.next, it->second.end);
    extents_.erase(it);
  }
  held_.erase(req_id);
}

HomeRows::Extent& HomeRows::new_extent(const std::string& req_id, std::int64_t needed) {
  const auto old = extents_.find(req_id);
  const auto held = held_.find(req_id);
  const std::int64_t want = std::max({extent_, held == held_.end() ? std::int64_t{0} : held->second, needed});
  std::int64_t start = -1;
  if (old != extents_.end() && free_.contains(old->second.end)) {  // continue the run
    start = old->second.end;
  } else {
    start = fitting_run(want);
    if (start < 0) {
      reclaim(req_id);
      start = fitting_run(want);
    }
  }
  if (start < 0) throw std::logic_error("home rows: no free row for a fresh block");
  const std::int64_t end = std::min(free_.at(start), start + want);
  take(start, end);
  if (old != extents_.end()) {
    old->second.next = start;  // keeps its place in the reclaim order
    old->second.end = end;
    return old->second;
  }
  return extents_[req_id] = Extent{start, end, next_order_++};
}

std::int64_t HomeRows::fitting_run(std::int64_t want) const {
  std::int64_t fits = -1, fits_n = 0, largest = -1, largest_n = 0;
  for (const auto& [s, e] : free_) {
    const std::int64_t n = e - s;
    if (n >= want && (fits < 0 || n < fits_n)) fits = s, fits_n = n;
    if (largest < 0 || n > largest_n) largest = s, largest_n = n;
  }
  return fits >= 0 ? fits : largest;
}

void HomeRows::reclaim(const std::string& req_id) {
  Extent* victim = nullptr;
  std::int64_t size = 0;
  for (auto& [other, ext] : extents_) {
    const std::int64_t n = ext.end - ext.next;
    if (other == req_id || n <= 0) continue;
    if (n > size || (n == size && victim != nullptr && ext.order < victim->order)) victim = &ext, size = n;
  }
  if (victim == nullptr) return;
  const std::int64_t keep = victim->next + size / 2;
  give_back(keep, victim->end);
  victim->end = keep;
}

void HomeRows::take(std::int64_t start, std::int64_t end) {
  const auto it = free_.find(start);
  const std::int64_t run_end = it->second;
  free_.erase(it);
  if (end < run_end) free_.emplace(end, run_end);
}

void HomeRows::give_back(std::int64_t start, std::int64_t end) {
  auto after = free_.lower_bound(start);
  if (after != free_.begin()) {
    const auto before = std::prev(after);
    if (before->second == start) {  // joins the run before
      start = before->first;
      free_.erase(before);
    }
  }
  if (after != free_.end() && after->first == end) {  // and the run after
    end = after->second;
    free_.erase(after);
  }
  free_[start] = end;
}

}  // namespace activekv
