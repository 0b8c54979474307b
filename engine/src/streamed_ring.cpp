// The ring's shared state (streamed_ring.h): a run of home rows as bytes, and
// the codec's way between rows and blocks.
#include "streamed_ring.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <utility>

namespace activekv::detail {

StreamedRing::StreamedRing(StreamingGeometry geometry_in, std::vector<at::Tensor> kv_in,
                           std::unique_ptr<HostArena> homes_in, std::unique_ptr<KVCodec> codec_in)
    : geometry(std::move(geometry_in)),
      kv(std::move(kv_in)),
      homes(std::move(homes_in)),
      codec(std::move(codec_in)),
      device(kv.front().device()),
      poisoned(kv.size() * static_cast<std::size_t>(homes->num_slots()), 0) {}

at::Tensor StreamedRing::home_bytes_of(std::int64_t streamed, const SlotRun& run) const {
  auto bytes = homes->run_view(streamed, run);
  if (!bytes.ok()) throw std::runtime_error(bytes.status().error());
  return bytes.value();
}

at::Tensor StreamedRing::decode(const at::Tensor& rows) const {
  const at::Tensor bytes = rows.view(at::kByte);  // [n, layer_bytes], from bytes or words
  if (codec) return codec->decode(bytes);
  const at::Tensor& first = kv.front();  // every streamed layer has its shape
  std::vector<std::int64_t> shape = first.sizes().vec();
  shape[0] = rows.size(0);
  return bytes.view(first.scalar_type()).view(shape);
}

void StreamedRing::copy_to_home(std::int64_t streamed, const SlotRun& rows, const at::Tensor& blocks) const {
  const at::Tensor home = home_bytes_of(streamed, rows);
  if (codec) {
    home.copy_(codec->encode(blocks), /*non_blocking=*/on_device());
  } else {
    decode(home).copy_(blocks, /*non_blocking=*/on_device());  // a view of the home
  }
}

void StreamedRing::copy_from_home(std::int64_t streamed, const SlotRun& rows, at::Tensor blocks) const {
  at::Tensor home = home_bytes_of(streamed, rows);
  // Compressed rows cross as they are and are decoded where the blocks live.
  if (codec && home.device() != blocks.device()) home = home.to(blocks.device(), /*non_blocking=*/true);
  blocks.copy_(decode(home), /*non_blocking=*/on_device());
}

}  // namespace activekv::detail
