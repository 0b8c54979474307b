// The KV cache geometry ActiveKV works with (one full-attention group).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "activekv/config.h"

namespace activekv {

struct KVLayout {
  std::vector<std::string> layer_names;
  std::int64_t block_size = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_size = 0;
  c10::ScalarType dtype = c10::ScalarType::BFloat16;

  // KV elements of one block of one layer (K and V).
  std::int64_t block_numel() const { return 2 * block_size * num_kv_heads * head_size; }
  std::int64_t layer_bytes(Mode mode) const;
  // Host bytes of one block over all layers: the unit of the store.
  std::int64_t slot_bytes(Mode mode) const {
    return static_cast<std::int64_t>(layer_names.size()) * layer_bytes(mode);
  }
};

}  // namespace activekv
