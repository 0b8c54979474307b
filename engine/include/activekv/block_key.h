// Block identity: a hash chain over full blocks of token ids, bound to the model
// identity and the request's cache_salt. Same bytes as the Python reference
// (reference/activekv_reference/identity.py).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "activekv/sha256.h"

namespace activekv {

using BlockKey = Digest;

struct ModelIdentity {
  std::string model;
  std::string dtype;  // "bfloat16", "float16", ...
  std::int64_t num_layers = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_size = 0;
  std::int64_t block_size = 0;
  std::int64_t tp_size = 1;

  // Stable digest of every field.
  Digest digest() const;
};

// Key that precedes block 0: binds the chain to the model and the tenant.
BlockKey chain_root(const Digest& identity_digest, const std::optional<std::string>& cache_salt);

// Key of the block holding `tokens`, following `parent`.
BlockKey next_key(const BlockKey& parent, std::span<const std::int64_t> tokens);

// Appends to `keys` the keys of the full blocks of `tokens` past the ones
// already in `keys` (so a growing sequence is hashed once per block).
void extend_block_keys(const Digest& identity_digest, const std::optional<std::string>& cache_salt,
                       std::span<const std::int64_t> tokens, std::int64_t block_size,
                       std::vector<BlockKey>& keys);

struct BlockKeyHash {
  std::size_t operator()(const BlockKey& k) const noexcept {
    std::size_t h;
    static_assert(sizeof(h) <= sizeof(BlockKey));
    __builtin_memcpy(&h, k.data(), sizeof(h));  // already uniformly distributed
    return h;
  }
};

}  // namespace activekv
