// A layer-streaming step's blocks as the ring's copies take them: plain
// functions of block ids, home rows and their runs (HostArena::runs), so the
// plan is testable without a device. The ring's copiers make them once a
// step (plan_step, src/ring_copies.h).
#pragma once

#include <cstdint>
#include <vector>

#include "activekv/host_arena.h"

namespace activekv::detail {

// Staging through pieces: the stage blocks and their home rows in the pieces'
// order, those in runs of at least `copy_engine_run` consecutive home rows
// first (the copy engine fills pieces from them), then the others (gathered).
struct PieceOrder {
  std::vector<SlotRun> copy_engine_runs;  // as `runs` gave them (offsets into the step's lists)
  std::vector<std::int64_t> blocks, rows;
  std::int64_t run_blocks = 0;  // the first run_blocks of `blocks` come from copy_engine_runs
};
// `runs`: HostArena::runs(rows); `blocks[i]` has home row `rows[i]`.
PieceOrder piece_order(const std::vector<SlotRun>& runs, const std::vector<std::int64_t>& blocks,
                       const std::vector<std::int64_t>& rows, std::int64_t copy_engine_run);

// A write-back split the same way: the long runs' blocks go home by the copy
// engine (each run's offset into long_blocks), the others the device writes
// into the mapped homes itself.
struct WritebackSplit {
  std::vector<SlotRun> long_runs;
  std::vector<std::int64_t> long_blocks;
  std::vector<std::int64_t> short_blocks, short_rows;
};
WritebackSplit split_writeback(const std::vector<SlotRun>& runs, const std::vector<std::int64_t>& blocks,
                               const std::vector<std::int64_t>& rows, std::int64_t copy_engine_run);

// The step's written-back blocks that it does not stage too, in block order
// (compressed homes: fresh blocks, zeroed before the compute writes them),
// and whether that is all of them (no block both staged and written back: a
// buffer's next occupant's staging need not wait for its last write-back).
struct WrittenOnly {
  std::vector<std::int64_t> blocks;
  bool all = true;
};
WrittenOnly written_not_staged(const std::vector<std::int64_t>& stage_blocks,
                               const std::vector<std::int64_t>& writeback_blocks);

// kRuns (and the CPU's memcpys): pairs of (block, home row) runs, each consecutive in both
// (inside one of `runs`, split where the block ids stop being consecutive),
// with its offset into the step's lists: one copy a run.
struct PairRun {
  std::int64_t block;
  std::int64_t row;
  std::int64_t count;
  std::int64_t offset;
};
std::vector<PairRun> pair_runs(const std::vector<SlotRun>& runs, const std::vector<std::int64_t>& blocks,
                               const std::vector<std::int64_t>& rows);

}  // namespace activekv::detail
