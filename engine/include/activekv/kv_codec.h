// KV codecs: how one layer's blocks become host bytes and back. Same ATen
// operations, in the same order, as the Python reference (codec.py), so the
// bytes are identical. See codec.py for the compressed format and its bound.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "activekv/config.h"

namespace activekv {

// Host bytes of one layer's block of `block_numel` KV elements.
std::int64_t codec_layer_bytes(Mode mode, std::int64_t block_numel, std::int64_t itemsize,
                               std::int64_t head_size);

class KVCodec {
 public:
  virtual ~KVCodec() = default;
  virtual std::int64_t layer_bytes() const = 0;
  // [n, *block_shape] KV -> [n, layer_bytes] uint8, on the same device.
  virtual at::Tensor encode(const at::Tensor& blocks) const = 0;
  // [n, layer_bytes] uint8 -> [n, *block_shape] KV, on the same device.
  virtual at::Tensor decode(const at::Tensor& data) const = 0;
};

// Throws std::invalid_argument when compressed mode cannot split the layout
// into head vectors.
std::unique_ptr<KVCodec> make_codec(Mode mode, std::vector<std::int64_t> block_shape, at::ScalarType dtype,
                                    std::int64_t head_size);

}  // namespace activekv
