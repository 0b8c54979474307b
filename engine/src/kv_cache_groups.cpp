#include "activekv/kv_cache_groups.h"

namespace activekv {
namespace {

// A list of names as Python's repr of a list of str writes it.
std::string python_list(const std::vector<std::string>& names) {
  std::string out = "[";
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? ", '" : "'") + names[i] + "'";
  return out + "]";
}

}  // namespace

std::optional<std::string> unservable_kv_cache_groups(const KVCacheGroups& groups) {
  if (groups.one_full_attention) return std::nullopt;
  return "KV cache groups " + python_list(groups.kinds) +
         ": it needs one full-attention group (no sliding-window or hybrid groups)";
}

}  // namespace activekv
