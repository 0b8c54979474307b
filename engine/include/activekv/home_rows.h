// Layer streaming: which host row holds each block's streamed layers. Mirrors
// the reference (reference/activekv_reference/homes.py), decision for
// decision: a block gets a row when vLLM gives it new content (a fresh block)
// and keeps it until vLLM does so again, so a shared prefix block has one
// home. Rows are given out per request in extents, so a request's blocks lie
// in long runs of consecutive rows whatever block ids vLLM chose and a step's
// staging is a few long copies. A request's fresh blocks take the next rows
// of its extent, each run of consecutive ids in id order (in_id_order): vLLM
// hands out a finished request's blocks tail first, so ids often run
// backwards, and a run of rows is one copy only where its ids ascend with it.
// A new extent reserves max(extent, rows the request holds, rows the step
// needs); it continues the previous extent where the rows after it are free,
// else takes the smallest free run that fits (lowest first), else the
// largest; with no free row, the largest other reservation (the earliest
// request among equals) gives up its second half.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace activekv {

// The smallest extent: 64 blocks, less on a small cache.
std::int64_t home_extent_for(std::int64_t num_blocks);
// Home rows for a KV cache of num_blocks blocks: 1/16 of slack, at least two
// extents. The scheduler and the workers compute the same.
std::int64_t home_rows_for(std::int64_t num_blocks);
// `blocks` with each run of ids descending by one reversed: the order their
// rows are given in.
std::vector<std::int64_t> in_id_order(const std::vector<std::int64_t>& blocks);

class HomeRows {
 public:
  explicit HomeRows(std::int64_t num_blocks);

  std::int64_t num_rows() const { return num_rows_; }
  // The home row of a block that has one (std::out_of_range otherwise).
  std::int64_t row(std::int64_t block) const { return row_of_.at(block); }
  bool has_row(std::int64_t block) const { return row_of_.contains(block); }
  // Free rows (neither mapped nor reserved) as maximal runs [start, end).
  const std::map<std::int64_t, std::int64_t>& free_runs() const { return free_; }

  // Rows for a request's fresh blocks (in block-table order), each run of ids
  // descending by one given its rows in id order.
  void assign(const std::string& req_id, const std::vector<std::int64_t>& fresh_blocks);
  // The request finished or starts over after preemption: its reservation
  // ends (its blocks keep their rows).
  void end_request(const std::string& req_id);

 private:
  struct Extent {
    std::int64_t next;    // the request's next row
    std::int64_t end;     // rows next .. end - 1 are reserved for it
    std::uint64_t order;  // when the request first got an extent (reclaim's tie-break)
  };
  Extent& new_extent(const std::string& req_id, std::int64_t needed);
  // The start of the smallest free run of at least `want` rows, else of the
  // largest; -1 when no row is free.
  std::int64_t fitting_run(std::int64_t want) const;
  void reclaim(const std::string& req_id);
  void take(std::int64_t start, std::int64_t end);
  void give_back(std::int64_t start, std::int64_t end);

  std::int64_t num_rows_;
  std::int64_t extent_;
  std::unordered_map<std::int64_t, std::int64_t> row_of_;  // block id -> row
  std::map<std::int64_t, std::int64_t> free_;              // free run start -> end
  std::unordered_map<std::string, Extent> extents_;
  std::unordered_map<std::string, std::int64_t> held_;  // rows given to the request so far
  std::uint64_t next_order_ = 0;
};

}  // namespace activekv
