// Admission policy: which full blocks a request may write to the host store.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>

#include "activekv/block_key.h"
#include "activekv/config.h"

namespace activekv {

// Sighting counts are kept for this many distinct blocks (oldest forgotten).
inline constexpr std::size_t kMaxTrackedSightings = std::size_t{1} << 16;

class AdmissionPolicy {
 public:
  AdmissionPolicy(const Config& config, std::int64_t slot_bytes);
  AdmissionPolicy(const AdmissionPolicy&) = delete;
  AdmissionPolicy& operator=(const AdmissionPolicy&) = delete;

  // Counts one sighting of the block (once per request).
  void sight(const BlockKey& key);
  std::int64_t sightings(const BlockKey& key) const;
  bool admits(const BlockKey& key) const { return sightings(key) >= threshold_; }
  bool within_request_cap(std::int64_t blocks_written) const {
    return !max_blocks_per_request_ || blocks_written < *max_blocks_per_request_;
  }
  // How many of a request's leading full blocks are in scope for saving.
  std::int64_t savable_blocks(std::int64_t num_full_blocks, std::int64_t num_prompt_tokens,
                              std::int64_t block_size) const;

 private:
  std::int64_t threshold_;
  bool store_decode_;
  std::optional<std::int64_t> max_blocks_per_request_;
  std::list<BlockKey> order_;  // least recently sighted first
  struct Count {
    std::int64_t n;
    std::list<BlockKey>::iterator pos;
  };
  std::unordered_map<BlockKey, Count, BlockKeyHash> counts_;
};

}  // namespace activekv
