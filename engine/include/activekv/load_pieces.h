// A step's loads from the host store as they cross to the device: pieces of
// one layer's rows (the step's load order), each at most a staging buffer's
// rows, so a load never needs its whole size on the device at once (a
// 128k-token hit of Llama-3-8B is 16 GiB over its layers). Plain functions,
// testable without a device; WorkerSide::start_load makes them.
#pragma once

#include <cstdint>
#include <vector>

#include "activekv/host_arena.h"

namespace activekv::detail {

struct LoadPiece {
  std::int64_t layer;
  std::int64_t row;  // its first row in the step's load order
  std::int64_t rows;
};

// Every layer's rows [0, rows) in pieces of at most `piece_rows`, layer by
// layer (the order the forward asks for them).
std::vector<LoadPiece> load_pieces(std::int64_t layers, std::int64_t rows, std::int64_t piece_rows);

// The parts of `runs` (HostArena::runs of the step's slots: offsets into the
// load order, ascending) inside rows [row, row + rows): each part's first slot
// and count, its offset counted from `row`.
std::vector<SlotRun> runs_within(const std::vector<SlotRun>& runs, std::int64_t row, std::int64_t rows);

}  // namespace activekv::detail
