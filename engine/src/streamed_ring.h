// What every ring copier shares (internal; layer_streaming.h): the streamed
// layers' views onto their ring buffers, their homes, the codec of compressed
// homes, the step's blocks, and the home rows a lost write-back left unknown.
// LayerStreamer owns it and sets the step; its copier (ring_copies.h) reads it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "activekv/host_arena.h"
#include "activekv/kv_codec.h"
#include "activekv/streaming_geometry.h"

namespace activekv::detail {

struct StreamedRing {
  StreamedRing(StreamingGeometry geometry, std::vector<at::Tensor> kv, std::unique_ptr<HostArena> homes,
               std::unique_ptr<KVCodec> codec);

  StreamingGeometry geometry;
  std::vector<at::Tensor> kv;  // per streamed layer: its view onto its ring buffer
  std::unique_ptr<HostArena> homes;
  std::unique_ptr<KVCodec> codec;  // compressed homes only; exact homes are the bytes
  c10::Device device;

  // The step's blocks, each list with its blocks' home rows in row order.
  std::vector<std::int64_t> stage_blocks, stage_rows;
  std::vector<std::int64_t> writeback_blocks, writeback_rows;
  // Compressed homes: the blocks the step writes and does not stage. A head
  // vector of some layouts (vLLM's CPU cache keeps K transposed) spans several
  // tokens, so a partly filled block's encode must not see the buffer's
  // previous occupant in its unused slots.
  std::vector<std::int64_t> fresh_blocks;
  // No block is both staged and written back: a ring buffer's next occupant
  // may be staged while its last occupant's write-back still reads the buffer.
  bool stage_writeback_disjoint = false;

  // Per streamed layer and home row ([layer * num_rows + row]): the row's
  // bytes are unknown (a write-back fence with an unknown outcome).
  std::vector<char> poisoned;

  std::int64_t num_streamed() const { return geometry.num_streamed(); }
  bool on_device() const { return device.type() != c10::DeviceType::CPU; }
  // Staging work this step: blocks to stage, or fresh blocks to zero.
  bool stages_this_step() const { return !stage_blocks.empty() || !fresh_blocks.empty(); }
  // Bytes of `blocks` in one streamed layer's homes.
  std::int64_t layer_bytes_of(const std::vector<std::int64_t>& blocks) const {
    return static_cast<std::int64_t>(blocks.size()) * homes->layer_bytes();
  }
  // The home rows of a run: their bytes, [count, layer_bytes].
  at::Tensor home_bytes_of(std::int64_t streamed, const SlotRun& run) const;
  // Rows of homes' bytes (or of wider words) as blocks of the KV cache's dtype
  // and shape: a view of exact homes, the codec's decode of compressed ones
  // (on the bytes' device).
  at::Tensor decode(const at::Tensor& rows) const;
  // A run of ring-buffer blocks to their home rows, and back (CPU: done on
  // return; device: issued on the current stream, non-blocking).
  void copy_to_home(std::int64_t streamed, const SlotRun& rows, const at::Tensor& blocks) const;
  void copy_from_home(std::int64_t streamed, const SlotRun& rows, at::Tensor blocks) const;
};

}  // namespace activekv::detail
