#include "activekv/step_runs.h"

#include <algorithm>

namespace activekv::detail {

PieceOrder piece_order(const std::vector<SlotRun>& runs, const std::vector<std::int64_t>& blocks,
                       const std::vector<std::int64_t>& rows, std::int64_t copy_engine_run) {
  PieceOrder out;
  std::vector<std::int64_t> gathered_blocks, gathered_rows;
  for (const auto& run : runs) {
    const bool long_run = run.count >= copy_engine_run;
    if (long_run) out.copy_engine_runs.push_back(run);
    auto& to_blocks = long_run ? out.blocks : gathered_blocks;
    auto& to_rows = long_run ? out.rows : gathered_rows;
    for (std::int64_t i = run.offset; i < run.offset + run.count; ++i) {
      to_blocks.push_back(blocks[static_cast<std::size_t>(i)]);
      to_rows.push_back(rows[static_cast<std::size_t>(i)]);
    }
  }
  out.run_blocks = static_cast<std::int64_t>(out.blocks.size());
  out.blocks.insert(out.blocks.end(), gathered_blocks.begin(), gathered_blocks.end());
  out.rows.insert(out.rows.end(), gathered_rows.begin(), gathered_rows.end());
  return out;
}

WritebackSplit split_writeback(const std::vector<SlotRun>& runs, const std::vector<std::int64_t>& blocks,
                               const std::vector<std::int64_t>& rows, std::int64_t copy_engine_run) {
  WritebackSplit out;
  for (const auto& run : runs) {
    const bool long_run = run.count >= copy_engine_run;
    if (long_run) {
      out.long_runs.push_back(
          SlotRun{run.first, run.count, static_cast<std::int64_t>(out.long_blocks.size())});
    }
    for (std::int64_t i = run.offset; i < run.offset + run.count; ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (long_run) {
        out.long_blocks.push_back(blocks[k]);
      } else {
        out.short_blocks.push_back(blocks[k]);
        out.short_rows.push_back(rows[k]);
      }
    }
  }
  return out;
}

WrittenOnly written_not_staged(const std::vector<std::int64_t>& stage_blocks,
                               const std::vector<std::int64_t>& writeback_blocks) {
  std::vector<std::int64_t> written = writeback_blocks;
  std::sort(written.begin(), written.end());
  std::vector<char> staged_too(written.size(), 0);
  for (const auto b : stage_blocks) {
    const auto it = std::lower_bound(written.begin(), written.end(), b);
    if (it != written.end() && *it == b) staged_too[static_cast<std::size_t>(it - written.begin())] = 1;
  }
  WrittenOnly out;
  for (std::size_t i = 0; i < written.size(); ++i) {
    if (staged_too[i]) {
      out.all = false;
    } else {
      out.blocks.push_back(written[i]);
    }
  }
  return out;
}

std::vector<PairRun> pair_runs(const std::vector<SlotRun>& runs, const std::vector<std::int64_t>& blocks,
                               const std::vector<std::int64_t>& rows) {
  std::vector<PairRun> out;
  for (const auto& run : runs) {
    for (std::int64_t i = run.offset; i < run.offset + run.count; ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (i > run.offset && blocks[k] == out.back().block + out.back().count) {
        ++out.back().count;
        continue;
      }
      out.push_back(PairRun{blocks[k], rows[k], 1, i});
    }
  }
  return out;
}

}  // namespace activekv::detail
