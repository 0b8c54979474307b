// A device's ring copies (internal; ring_copies.h): CUDA and XPU. One copy
// stream carries every staging and write-back, so a buffer's write-back of
// streamed layer j precedes the staging of layer j + K into it:
//   start          the copy stream waits for the compute stream (the ring's
//                  previous occupants are done), then stages the first K
//                  streamed layers;
//   stage          the compute stream waits for the layer's stage fence
//                  (and the buffer's last occupant's write-back);
//   write_back     the copy stream waits for the compute stream (the layer's
//                  attention), then copies the write-back rows home
//                  (kCopyEngineBatch: a write-back stream does, beside the
//                  staging crossing the other way; the buffer's next
//                  occupant's staging waits for it only where a block is both
//                  staged and written back, its compute always);
//   stage_ahead    after the store save's gather of layer j (the copy stream
//                  waits for it: the gather reads the buffer), stage layer
//                  j + K into the buffer.
// How the bytes cross is the copy method (StreamCopy): kRuns here,
// kDeviceGather and kCopyEngineBatch in device_copy_methods.cpp (kDeviceGather: a
// gather stream reads the homes into staging pieces; the copy stream scatters
// each piece into the buffer once it is read and its turn came).
// A write-back's fence is settled at the next end_step (waiting at most
// fence_timeout_ms past the step; with settle_across_steps, at the first
// end_step that finds it done or past that deadline); one with an unknown
// outcome poisons its blocks' home rows (StreamedRing::poisoned).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "activekv/settle_queue.h"
#include "activekv/step_runs.h"
#include "ring_copies.h"

namespace activekv::detail {
struct CopyBatch;
class CudaCodecKernels;

class DeviceRingCopies final : public RingCopies {
 public:
  // Chooses the copy method: kCopyEngineBatch on CUDA with home rows of
  // 32 KiB and more, kDeviceGather on CUDA and XPU otherwise when the ring
  // buffers' blocks are whole rows, kRuns otherwise. `head_size` splits
  // blocks into head vectors for the fused codec of compressed homes.
  DeviceRingCopies(StreamedRing& ring, std::int64_t fence_timeout_ms, std::int64_t head_size);
  ~DeviceRingCopies() override;

  void end_step() override;
  void plan_step() override;
  void start(Telemetry& stats) override;
  void stage(std::int64_t streamed, Telemetry& stats) override;
  void write_back(std::int64_t streamed, Telemetry& stats) override;
  void stage_ahead(std::int64_t streamed, std::optional<c10::Event> gathered, Telemetry& stats) override;
  void synchronize() override;
  bool can_copy_by(StreamCopy method) const override;
  void set_copy_method(StreamCopy method) override;
  void set_tuning(const StreamingTuning& tuning) override;
  bool has_fused_codec() const override { return codec_kernels_ != nullptr; }
  const std::string& fused_codec_missing() const override { return codec_kernels_missing_; }

 private:
  // --- The step's order on the device (device_ring_copies.cpp) ---
  // Issues the staging of a streamed layer on the copy stream (from the issue
  // thread, where there is one). one_call: the batch goes to the driver in
  // one call (ahead_in_one_call).
  void issue_stage(std::int64_t streamed, bool one_call = false);
  // write_back's task: waits for the layer's attention (`attended`) and
  // issues its write-back, recording the fences the buffer's next occupant,
  // the next step and settle_writebacks wait on.
  void issue_write_back(std::int64_t streamed, const std::shared_ptr<c10::Event>& attended, bool last_use,
                        std::chrono::steady_clock::time_point deadline);
  // The write-back's copies, on `stream` (the copy stream, or the write-back stream).
  void copy_write_back(std::int64_t streamed, const c10::Stream& stream);
  void apply_issue_thread();  // starts or stops it as tuning_ says
  // In issue order; wait: each until it completes or passes its deadline,
  // otherwise up to the first still running within its deadline.
  void settle_writebacks(bool wait);
  // settle_across_steps: on the streams that stage `streamed`, waits for what
  // earlier steps left: its homes' last write-back, and where it is its ring
  // buffer's first occupant, the buffer's last use.
  void wait_for_last_step(std::size_t streamed);
  // settle_across_steps and `streamed` is its buffer's last occupant: its uses
  // (attention, write-back, store gather) are what the next step's first
  // staging into the buffer waits for, not the copy stream.
  bool carries_last_use(std::int64_t streamed) const {
    return tuning_.settle_across_steps && streamed + ring_.geometry.ring_size >= ring_.num_streamed();
  }
  // Compressed homes: the step's fresh blocks as zeros in the buffer, on the current stream.
  void zero_fresh(std::int64_t streamed);

  // --- The copy methods' parts (device_copy_methods.cpp) ---
  // Staging through pieces, decoded on the copy stream: kDeviceGather, and
  // kCopyEngineBatch with compressed homes (whose pieces the batch fills).
  bool stages_by_pieces() const {
    return method_ == StreamCopy::kDeviceGather || (ring_.codec && method_ == StreamCopy::kCopyEngineBatch);
  }
  bool batched_pieces() const { return ring_.codec && method_ == StreamCopy::kCopyEngineBatch; }
  bool fused_codec_in_use() const { return codec_kernels_ && tuning_.fused_codec; }
  void load_fused_codec(std::int64_t head_size);
  // kDeviceGather: a step's blocks as the device indexes them. Home rows in
  // order group by home chunk; `local` is each block's row inside its chunk.
  struct ChunkSpan {
    std::int64_t chunk;
    std::int64_t offset;  // into the step's blocks
    std::int64_t count;
  };
  struct DeviceIndex {
    std::vector<ChunkSpan> spans;
    at::Tensor blocks;  // device int64 [n]
    at::Tensor local;   // device int64 [n]
    // Row of (streamed layer l, block i) in all_homes_: base[i] + l * step[i].
    at::Tensor base, step;
  };
  bool init_device_gather();
  void make_pieces();
  // Block ids onto the device, on the current stream.
  at::Tensor upload_ids(const std::vector<std::int64_t>& ids) const;
  DeviceIndex device_index(const std::vector<std::int64_t>& blocks,
                           const std::vector<std::int64_t>& rows) const;
  void gather_stage(std::int64_t streamed);
  void gather_write_back(std::int64_t streamed);
  // Blocks as their homes' rows of gather words: a view when exact, the
  // codec's encode (on the blocks' device) when compressed.
  at::Tensor encode_words(const at::Tensor& blocks) const;
  // Ring blocks `ids` of `kv` as their homes' rows of gather words, and rows
  // of homes' bytes or words into ring blocks `ids`; on the current stream,
  // by the fused codec kernels where in use.
  at::Tensor encode_ring_words(const at::Tensor& kv, const at::Tensor& ids) const;
  void decode_into_ring(at::Tensor& kv, const at::Tensor& ids, const at::Tensor& rows) const;
  // A contiguous ring buffer's blocks as rows of its widest word (a fill or
  // scatter moves a word per element).
  static at::Tensor ring_words(const at::Tensor& kv);
  // kCopyEngineBatch: a layer's runs between its homes and its ring buffer as
  // one batch, on `stream` (the copy stream, or the write-back stream).
  bool init_batch_copy();
  void batch_copy(std::int64_t streamed, const std::vector<PairRun>& runs, bool to_home,
                  const c10::Stream& stream, bool one_call = false);
  std::size_t batch_first_call() const { return static_cast<std::size_t>(tuning_.batch_first_call); }
  // Where home row `row` of streamed layer `streamed` starts (a pinned host
  // address, the device's own under unified addressing).
  std::uint64_t home_address(std::size_t streamed, std::int64_t row) const;

  // A step's write-back of one streamed layer, until its fence settles.
  struct PendingWriteback {
    std::vector<std::int64_t> rows;
    std::size_t layer;                  // among the streamed
    std::shared_ptr<c10::Event> fence;  // shared with the waits on it
    std::chrono::steady_clock::time_point deadline;
  };
  // settle_across_steps: what a step left using a ring buffer, which the next
  // step's first staging into it waits for: its last occupant's attention
  // (reading it), write-back and store gather (reading its blocks).
  struct BufferLastUse {
    std::shared_ptr<c10::Event> attended, written_back, gathered;
    std::uint64_t step = 0;  // the step (step_) that set them
  };

  std::int64_t fence_timeout_ms_;
  c10::Stream copy_stream_;  // carries every staging and, but for kCopyEngineBatch's, write-back
  std::unique_ptr<CudaCodecKernels> codec_kernels_;  // compressed homes, CUDA, bf16
  std::string codec_kernels_missing_;
  bool device_gather_possible_ = false;
  bool batch_copy_possible_ = false;
  std::unique_ptr<CopyBatch> batch_;             // kCopyEngineBatch: a layer's copies, reused
  std::optional<c10::Stream> writeback_stream_;  // kCopyEngineBatch with tuning_.writeback_stream

  // kDeviceGather.
  std::optional<c10::Stream> gather_stream_;
  at::ScalarType word_type_ = at::kByte;            // the widest element a row divides into
  std::vector<std::vector<at::Tensor>> home_rows_;  // [streamed][chunk]: the device's view, in words
  // Every home row of every chunk as rows of one strided device view: a row
  // starts every `homes_grain_` bytes from the lowest chunk (rows overlap, so
  // it is read-only), and one index_select reads across chunks.
  at::Tensor all_homes_;
  std::int64_t homes_grain_ = 0;
  std::uintptr_t homes_base_ = 0;
  std::vector<std::uintptr_t> chunk_starts_;  // layer 0's first row of each chunk
  // Per step (stages_by_pieces): the stage blocks in the pieces' order, and
  // the write-back split between the copy engine and the device's writes.
  PieceOrder pieces_plan_;
  WritebackSplit writeback_split_;
  std::vector<at::Tensor> pieces_;                     // device staging, [piece_rows, words] each
  std::vector<std::optional<c10::Event>> piece_free_;  // recorded on the copy stream after its scatter
  std::size_t next_piece_ = 0;
  std::optional<DeviceIndex> stage_index_;        // per step, made on first use
  std::optional<DeviceIndex> writeback_index_;    // the short write-back blocks
  std::optional<at::Tensor> writeback_long_ids_;  // device int64: writeback_split_.long_blocks

  // Per step.
  std::optional<at::Tensor> fresh_ids_;  // on the device, made on first use
  std::vector<PairRun> stage_runs_;      // kRuns, and kCopyEngineBatch with exact homes
  std::vector<PairRun> writeback_runs_;
  std::vector<std::optional<c10::Event>> stage_fences_;  // per streamed layer
  // Per streamed layer: the write-back of the ring buffer's previous occupant
  // (settle_across_steps: for a first occupant, the last step's), which the
  // layer's compute waits for.
  std::vector<std::shared_ptr<c10::Event>> occupant_writeback_;
  // settle_across_steps, set by the tasks issuing write-backs and stagings:
  // per ring buffer its last use, per streamed layer its homes' last
  // write-back while it may run; each taken by the next staging that needs it.
  std::vector<BufferLastUse> buffer_last_use_;
  std::vector<std::shared_ptr<c10::Event>> home_writeback_;
  std::uint64_t step_ = 0;  // end_step's count
  // Per step: settle_across_steps, and the last step reached every buffer's
  // last occupant, so this one's stagings wait for those alone.
  bool from_last_step_ = false;
  SettleQueue<PendingWriteback> pending_writebacks_;
};

}  // namespace activekv::detail
