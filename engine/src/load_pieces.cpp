#include "activekv/load_pieces.h"

#include <algorithm>

namespace activekv::detail {

std::vector<LoadPiece> load_pieces(std::int64_t layers, std::int64_t rows, std::int64_t piece_rows) {
  std::vector<LoadPiece> out;
  if (rows <= 0 || piece_rows <= 0) return out;
  for (std::int64_t l = 0; l < layers; ++l) {
    for (std::int64_t r = 0; r < rows; r += piece_rows) out.push_back({l, r, std::min(piece_rows, rows - r)});
  }
  return out;
}

std::vector<SlotRun> runs_within(const std::vector<SlotRun>& runs, std::int64_t row, std::int64_t rows) {
  std::vector<SlotRun> out;
  const std::int64_t end = row + rows;
  // The last run starting at or before `row`: a step's pieces each look up
  // their own rows, not every run of the load.
  auto it = std::upper_bound(runs.begin(), runs.end(), row,
                             [](std::int64_t r, const SlotRun& run) { return r < run.offset; });
  if (it != runs.begin()) --it;
  for (; it != runs.end() && it->offset < end; ++it) {
    const SlotRun& run = *it;
    const std::int64_t from = std::max(row, run.offset);
    const std::int64_t to = std::min(end, run.offset + run.count);
    if (from < to) out.push_back(SlotRun{run.first + (from - run.offset), to - from, from - row});
  }
  return out;
}

}  // namespace activekv::detail
