#include "activekv/block_key.h"

namespace activekv {
namespace {

void put_u64_le(Sha256& h, std::uint64_t v) {
  std::uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(v >> (8 * i));
  h.update(b, sizeof(b));
}

}  // namespace

Digest ModelIdentity::digest() const {
  const std::string text =
      "model=" + model + "|dtype=" + dtype + "|num_layers=" + std::to_string(num_layers) +
      "|num_kv_heads=" + std::to_string(num_kv_heads) + "|head_size=" + std::to_string(head_size) +
      "|block_size=" + std::to_string(block_size) + "|tp_size=" + std::to_string(tp_size);
  return Sha256::of("activekv-identity-v1|" + text);
}

BlockKey chain_root(const Digest& identity_digest, const std::optional<std::string>& cache_salt) {
  const std::string salt = cache_salt ? "salt:" + *cache_salt : std::string();
  Sha256 h;
  h.update(identity_digest.data(), identity_digest.size());
  put_u64_le(h, salt.size());
  h.update(salt);
  return h.finish();
}

BlockKey next_key(const BlockKey& parent, std::span<const std::int64_t> tokens) {
  Sha256 h;
  h.update(parent.data(), parent.size());
  for (const std::int64_t t : tokens) put_u64_le(h, static_cast<std::uint64_t>(t));
  return h.finish();
}

void extend_block_keys(const Digest& identity_digest, const std::optional<std::string>& cache_salt,
                       std::span<const std::int64_t> tokens, std::int64_t block_size,
                       std::vector<BlockKey>& keys) {
  const auto full = static_cast<std::size_t>(static_cast<std::int64_t>(tokens.size()) / block_size);
  if (keys.size() >= full) return;
  BlockKey parent = keys.empty() ? chain_root(identity_digest, cache_salt) : keys.back();
  const auto bs = static_cast<std::size_t>(block_size);
  for (std::size_t i = keys.size(); i < full; ++i) {
    parent = next_key(parent, tokens.subspan(i * bs, bs));
    keys.push_back(parent);
  }
}

}  // namespace activekv
