// LayerStreamer's home rows (layer_streaming.h): a run of rows as bytes, the
// codec's way between rows and blocks, and a step's blocks and rows checked
// and cut into runs that each cross in one copy.
#include "activekv/layer_streaming.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace activekv {

at::Tensor LayerStreamer::home_bytes_of(std::int64_t streamed, const SlotRun& run) {
  auto bytes = homes_->run_view(streamed, run);
  if (!bytes.ok()) throw std::runtime_error(bytes.status().error());
  return bytes.value();
}

at::Tensor LayerStreamer::decode(const at::Tensor& rows) const {
  const at::Tensor bytes = rows.view(at::kByte);  // [n, layer_bytes], from bytes or words
  if (codec_) return codec_->decode(bytes);
  const at::Tensor& kv = streamed_kv_.front();  // every streamed layer has its shape
  std::vector<std::int64_t> shape = kv.sizes().vec();
  shape[0] = rows.size(0);
  return bytes.view(kv.scalar_type()).view(shape);
}

at::Tensor LayerStreamer::encode_words(const at::Tensor& blocks) const {
  if (codec_) return codec_->encode(blocks).view(word_type_);
  return blocks.reshape({blocks.size(0), -1}).view(at::kByte).view(word_type_);
}

void LayerStreamer::copy_to_home(std::int64_t streamed, const SlotRun& rows, const at::Tensor& blocks) {
  const at::Tensor home = home_bytes_of(streamed, rows);
  if (codec_) {
    home.copy_(codec_->encode(blocks), /*non_blocking=*/has_streams());
  } else {
    decode(home).copy_(blocks, /*non_blocking=*/has_streams());  // a view of the home
  }
}

void LayerStreamer::copy_from_home(std::int64_t streamed, const SlotRun& rows, at::Tensor blocks) {
  at::Tensor home = home_bytes_of(streamed, rows);
  // Compressed rows cross as they are and are decoded where the blocks live.
  if (codec_ && home.device() != blocks.device()) home = home.to(blocks.device(), /*non_blocking=*/true);
  blocks.copy_(decode(home), /*non_blocking=*/has_streams());
}

void LayerStreamer::check_rows(const std::vector<std::int64_t>& blocks,
                               const std::vector<std::int64_t>& rows) const {
  if (rows.size() != blocks.size()) {
    throw std::out_of_range(std::to_string(rows.size()) + " home rows for " + std::to_string(blocks.size()) +
                            " streamed blocks");
  }
  for (const auto row : rows) {
    if (row < 0 || row >= homes_->num_slots()) {
      throw std::out_of_range("home row " + std::to_string(row) + " out of range (the homes have " +
                              std::to_string(homes_->num_slots()) + " rows)");
    }
  }
}

std::vector<LayerStreamer::HomeRun> LayerStreamer::home_runs(const std::vector<std::int64_t>& blocks,
                                                             const std::vector<std::int64_t>& rows) const {
  // Made once a step, used by every streamed layer.
  const bool by_index = codec_ || !streamed_kv_.front().is_contiguous();
  std::vector<HomeRun> out;
  for (const auto& run : homes_->runs(rows)) {
    const auto first = blocks.begin() + run.offset;
    std::vector<std::int64_t> ids(first, first + run.count);
    bool consecutive = true;
    for (std::size_t i = 1; i < ids.size(); ++i) consecutive = consecutive && ids[i] == ids[i - 1] + 1;
    HomeRun r{run, consecutive, std::move(ids), std::nullopt};
    if (!consecutive && by_index) r.ids = at::tensor(r.blocks, at::kLong);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace activekv
