#include "activekv/admission_policy.h"

#include <algorithm>

namespace activekv {

AdmissionPolicy::AdmissionPolicy(const Config& config, std::int64_t slot_bytes)
    : threshold_(config.store_threshold), store_decode_(config.store_blocks == StoreScope::kPromptAndDecode) {
  if (config.max_bytes_per_request != 0) {
    max_blocks_per_request_ = config.max_bytes_per_request / slot_bytes;
  }
}

void AdmissionPolicy::sight(const BlockKey& key) {
  auto it = counts_.find(key);
  if (it == counts_.end()) {
    counts_.emplace(key, Count{1, order_.insert(order_.end(), key)});
  } else {
    ++it->second.n;
    order_.splice(order_.end(), order_, it->second.pos);
  }
  while (counts_.size() > kMaxTrackedSightings) {
    counts_.erase(order_.front());
    order_.pop_front();
  }
}

std::int64_t AdmissionPolicy::sightings(const BlockKey& key) const {
  const auto it = counts_.find(key);
  return it == counts_.end() ? 0 : it->second.n;
}

std::int64_t AdmissionPolicy::savable_blocks(std::int64_t num_full_blocks, std::int64_t num_prompt_tokens,
                                             std::int64_t block_size) const {
  if (store_decode_) return num_full_blocks;
  return std::min(num_full_blocks, num_prompt_tokens / block_size);
}

}  // namespace activekv
