// SHA-256 (FIPS 180-4). Block keys must be the same bytes in every process
// and in the Python reference (hashlib.sha256), so the engine carries its own.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace activekv {

using Digest = std::array<std::uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // Finishes the hash; the object must not be updated afterwards.
  Digest finish();

  static Digest of(std::string_view s) {
    Sha256 h;
    h.update(s);
    return h.finish();
  }

 private:
  void compress(const std::uint8_t* block);

  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> buffer_{};
  std::size_t buffered_ = 0;
  std::uint64_t total_bytes_ = 0;
};

}  // namespace activekv
