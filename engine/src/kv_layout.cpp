#include "activekv/kv_layout.h"

#include "activekv/kv_codec.h"

namespace activekv {

std::int64_t KVLayout::layer_bytes(Mode mode) const {
  return codec_layer_bytes(mode, block_numel(), static_cast<std::int64_t>(c10::elementSize(dtype)),
                           head_size);
}

}  // namespace activekv
