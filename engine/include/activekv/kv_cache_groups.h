// vLLM's KV cache groups as start-up reads them, and ActiveKV's one rule about
// them: exactly one group, whose spec is vLLM's FullAttentionSpec itself. The
// host store (its layout) and layer streaming refuse other models with the
// same words. Plain data, no torch.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace activekv {

struct KVCacheGroups {
  std::vector<std::string> kinds;   // the type name of each group's KV cache spec
  bool one_full_attention = false;  // exactly one group, of FullAttentionSpec itself
};

// Why ActiveKV cannot serve these groups, naming their kinds, written to follow
// "<who> cannot serve "; nothing when it can.
std::optional<std::string> unservable_kv_cache_groups(const KVCacheGroups& groups);

}  // namespace activekv
