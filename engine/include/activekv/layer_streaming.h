// Layer streaming: contexts longer than the device's KV memory. Mirrors the
// reference (reference/activekv_reference/streaming.py). This header is
// the ring and its copies (layer_streaming.cpp; the device gather,
// device_gather.cpp); which layers are resident and which buffer a streamed
// layer uses is streaming_geometry.h.
//
// Per step and streamed layer, in vLLM's order:
//   before the layer's KV cache update (wait_for_layer_load): the layer's home
//       rows of the step's stage blocks are in its ring buffer; the step's
//       loads from the host store then land on top;
//   after the layer's attention (save_kv_layer): the step's write-back blocks
//       go from the buffer back to their homes; the buffer then serves the
//       streamed layer K places later.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "activekv/config.h"
#include "activekv/streaming_tuning.h"
#include "activekv/host_arena.h"
#include "activekv/kv_codec.h"
#include "activekv/settle_queue.h"
#include "activekv/status.h"
#include "activekv/step_runs.h"
#include "activekv/streaming_geometry.h"
#include "activekv/telemetry.h"

namespace activekv {
namespace detail {
struct CopyBatch;
class CudaCodecKernels;
class CopyThread;
}  // namespace detail

// How staged and written-back blocks cross between the homes and the ring.
enum class StreamCopy {
  // One copy per run of consecutive block ids, straight between the home rows
  // and the ring buffer's blocks: the CPU's way. On a device the copy engine
  // pays a few microseconds per copy, so blocks scattered as a long-running
  // server leaves them (runs of one 64 KiB block) cross at ~5 GB/s.
  kRuns,
  // The device reads and writes the home rows itself: pinned host memory is
  // mapped into CUDA's (unified addressing) and XPU's (USM host memory)
  // address space, so one gather kernel per staging piece pulls scattered
  // rows of any home chunk over the bus (a strided view over every chunk),
  // and the copy stream scatters each piece into the ring buffer while the
  // next piece crosses. Long runs fill pieces by the copy engine, which needs
  // no SM (StreamingTuning). Write-backs index_copy_ into the homes.
  kDeviceGather,
  // CUDA with exact homes: every run of consecutive home rows and block ids is
  // one copy, and a layer's copies go as one batch of the driver's batched
  // copy (cuMemcpyBatchAsync, CUDA 12.8 and later), straight between the homes
  // and the ring's blocks, both ways. The copy engines do it all, so nothing
  // waits for SMs a compute-bound attention holds (an SM scatter did: 1.11x
  // the bus time beside a prefill chunk's attention, the batch 1.00x,
  // docs/benchmarks/history.md 2026-12-04). The host pays about 0.5 us a copy to issue
  // them, and copies under 32 KiB cross slower than a gather kernel's, so
  // create() chooses it for blocks of 32 KiB and more. Compressed homes
  // (rows of int8 and scales, decoded on the device) cross the same way
  // between the homes and kDeviceGather's staging pieces: a piece's rows as one
  // batch in, decoded into the ring on the copy stream; a write-back's blocks
  // encoded into rows on the device, then one batch home. So no SM reads or
  // writes host memory (an SM gather or index_copy_ over the bus holds its SMs
  // for the bus's latency, between two layers' attention).
  kCopyEngineBatch,
};

// "runs", "gather", "batch": for reports and benchmarks.
const char* copy_method_name(StreamCopy method);

// Worker side: the homes of the streamed layers and the copies in and out.
//
// Homes: a HostArena with one slot per home row (home_rows_for(num_blocks)
// of them; the scheduler gives each block its row, home_rows.h), one "layer"
// per streamed layer, layer_bytes = exact bytes of one block of one layer;
// zeroed at creation (the reference's homes start as zeros), pinned where an
// accelerator exists. Copies go as copy_method() says: kCopyEngineBatch on
// CUDA with home rows of 32 KiB and more, kDeviceGather on CUDA and
// XPU otherwise when the ring buffer's blocks are whole rows, kRuns otherwise.
//
// On CPU the copies are the forward's own: stage copies in
// wait_for_layer_load's call, write_back in save_kv_layer's. Beside a bound
// forward (cpu_copy_thread) a thread of their own plays the copy stream's part
// below, in post order: start posts the first K stagings, stage_ahead posts
// layer j's write-back with layer j + K's staging as one task, and stage waits
// for the layer's staging and its buffer's last occupant's write-back;
// begin_step waits for the last step's. On a device (CUDA, XPU) one copy stream
// carries every staging and write-back, so a buffer's write-back of streamed
// layer j precedes the staging of layer j + K into it:
//   start          the copy stream waits for the compute stream (the ring's
//                  previous occupants are done), then stages the first K
//                  streamed layers (start_one_layer: the first; the first
//                  layer's write_back issues the others);
//                  (kDeviceGather: a gather stream reads the homes into
//                  staging pieces; the copy stream scatters each piece into
//                  the buffer once it is read and its turn on the copy
//                  stream came);
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
// A write-back's fence is settled at the next begin_step (waiting at most
// fence_timeout_ms past the step; with settle_across_steps, at the first
// begin_step that finds it done or past that deadline); one with an unknown
// outcome poisons its blocks' homes, and a later step that stages a poisoned
// block reports it as a load error (vLLM then recomputes the request).
class LayerStreamer {
 public:
  // Checks that the streamed layers' KV caches alias their ring buffers (the
  // reference's message) and allocates the homes. `kv_caches` must hold every
  // layer of the geometry, checked by the caller.
  // `head_size` splits blocks into head vectors for compressed homes.
  // `workers`: how many of vLLM's workers share this host's CPUs; beside a
  // second one a CPU copy thread is not started (cpu_copy_thread: the
  // forward's neighbouring cores may be another worker's forward).
  static Result<std::unique_ptr<LayerStreamer>> create(
      StreamingGeometry geometry, const std::unordered_map<std::string, at::Tensor>& kv_caches,
      std::int64_t fence_timeout_ms, std::int64_t head_size, std::int64_t workers = 1);
  ~LayerStreamer();
  LayerStreamer(const LayerStreamer&) = delete;
  LayerStreamer& operator=(const LayerStreamer&) = delete;

  const StreamingGeometry& geometry() const { return geometry_; }
  HostArena& homes() { return *homes_; }
  StreamCopy copy_method() const { return copy_method_; }
  // Whether this streamer's device, homes and ring allow `method`
  // (kDeviceGather: a device that maps pinned memory, whole-row blocks;
  // kCopyEngineBatch: that on CUDA with the batched copy).
  bool can_copy_by(StreamCopy method) const;
  // For benchmarks and tests comparing the methods; std::invalid_argument
  // where !can_copy_by(method). Must be called between steps.
  void set_copy_method(StreamCopy method);
  const StreamingTuning& tuning() const { return tuning_; }
  // CPU: the CPUs the copy thread runs on (cpu_copy_thread); empty where the
  // copies run on the forward's thread.
  const std::vector<int>& copy_thread_cpus() const { return copy_thread_cpus_; }
  // Compressed homes on CUDA: whether the fused codec kernels were compiled,
  // and if not, why (empty where they do not apply).
  bool has_fused_codec() const { return codec_kernels_ != nullptr; }
  const std::string& fused_codec_missing() const { return codec_kernels_missing_; }
  // Between steps. Takes `tuning` as it is: the constructor's rules for
  // settle_across_steps (off without streams, or with the environment's =0)
  // apply to the streamer's own tuning, so start from tuning() to keep them.
  void set_tuning(const StreamingTuning& tuning);

  // One home row per block, each in range (std::out_of_range, the
  // reference's message, otherwise).
  void check_rows(const std::vector<std::int64_t>& blocks, const std::vector<std::int64_t>& rows) const;
  // Must be called once per step, before start: unique block ids in range
  // (the caller checks), each list with its blocks' home rows in row order
  // (check_rows). Settles the previous step's write-backs first
  // (settle_across_steps: those done by now, and the oldest while more than
  // two steps' are in flight).
  void begin_step(std::vector<std::int64_t> stage_blocks, std::vector<std::int64_t> stage_rows,
                  std::vector<std::int64_t> writeback_blocks, std::vector<std::int64_t> writeback_rows);
  bool moves_blocks_this_step() const { return !stage_blocks_.empty() || !writeback_blocks_.empty(); }
  // Device: issues the staging of the first K streamed layers. CPU: posts
  // them to the copy thread where one runs this step, otherwise nothing.
  void start(Telemetry& stats);
  // The layer's stage blocks are in its buffer once this returns (CPU) or on
  // the compute stream (device); once per layer and step, nothing for a
  // resident layer.
  void stage(const std::string& name, Telemetry& stats);
  // The layer's write-back blocks go home (issued, on a device; left for
  // stage_ahead to post, on the CPU copy thread). Must be called after the
  // layer's attention.
  void write_back(const std::string& name, Telemetry& stats);
  // Device and the CPU copy thread, after write_back and the store save's
  // gather of `name` (`gathered`, when there was one): stages the streamed
  // layer K places later (on the copy thread, with `name`'s write-back).
  void stage_ahead(const std::string& name, std::optional<c10::Event> gathered, Telemetry& stats);
  // The bytes of a streamed layer's home, every row in row order (the
  // reference's home tensor); waits for the copies in flight. For parity
  // checks and tests. Must be called with a streamed layer.
  std::string home_bytes(const std::string& name);
  // Blocks staged from a poisoned home row since the last call.
  std::vector<std::int64_t> take_poisoned_stages();
  // Waits for every issued copy (a device's copy stream). Must be called
  // before the homes or the ring buffers go away.
  void synchronize();

 private:
  LayerStreamer(StreamingGeometry geometry, std::vector<at::Tensor> streamed_kv,
                std::unique_ptr<HostArena> homes, std::unique_ptr<KVCodec> codec,
                std::int64_t fence_timeout_ms, std::int64_t head_size, std::int64_t workers);
  bool has_streams() const { return device_.type() != c10::DeviceType::CPU; }
  // begin_step's parts: the step's runs as its copy method takes them, and
  // the stage blocks whose home rows are poisoned.
  void plan_copies();
  void note_poisoned_stages();
  // The home rows of a run: their bytes, [count, layer_bytes].
  at::Tensor home_bytes_of(std::int64_t streamed, const SlotRun& run);
  // Rows of homes' bytes (or of gather words) as blocks of the KV cache's dtype
  // and shape: a view of exact homes, the codec's decode of compressed ones
  // (on the bytes' device).
  at::Tensor decode(const at::Tensor& rows) const;
  // Blocks as their homes' rows of gather words: a view when exact, the
  // codec's encode (on the blocks' device) when compressed.
  at::Tensor encode_words(const at::Tensor& blocks) const;
  // Device: ring blocks `ids` of `kv` as their homes' rows of gather words,
  // and rows of homes' bytes or words into ring blocks `ids`; on the current
  // stream, by the fused codec kernels where in use.
  bool fused_codec_in_use() const { return codec_kernels_ && tuning_.fused_codec; }
  // Staging through pieces, decoded on the copy stream: kDeviceGather, and
  // kCopyEngineBatch with compressed homes (whose pieces the batch fills).
  bool stages_by_pieces() const {
    return copy_method_ == StreamCopy::kDeviceGather ||
           (codec_ && copy_method_ == StreamCopy::kCopyEngineBatch);
  }
  bool batched_pieces() const { return codec_ && copy_method_ == StreamCopy::kCopyEngineBatch; }
  // Where home row `row` of streamed layer `streamed` starts (a pinned host
  // address, the device's own under unified addressing).
  std::uint64_t home_address(std::size_t streamed, std::int64_t row) const;
  at::Tensor encode_ring_words(const at::Tensor& kv, const at::Tensor& ids) const;
  void decode_into_ring(at::Tensor& kv, const at::Tensor& ids, const at::Tensor& rows) const;
  // A run of ring-buffer blocks to their home rows, and back (CPU: done on
  // return; device: issued on the current stream, non-blocking).
  void copy_to_home(std::int64_t streamed, const SlotRun& rows, const at::Tensor& blocks);
  void copy_from_home(std::int64_t streamed, const SlotRun& rows, at::Tensor blocks);
  // Issues the staging of a streamed layer on the copy stream (from the issue
  // thread, where there is one).
  // one_call: the batch goes to the driver in one call (ahead_in_one_call).
  void issue_stage(std::int64_t streamed, bool one_call = false);
  // write_back's task: waits for the layer's attention (`attended`) and
  // issues its write-back, recording the fences the buffer's next occupant,
  // the next step and settle_writebacks wait on.
  void issue_write_back(std::int64_t streamed, const std::shared_ptr<c10::Event>& attended, bool last_use,
                        std::chrono::steady_clock::time_point deadline);
  // The caller's share of staging a layer: marks it issued and counts its bytes.
  void note_stage_issued(std::int64_t streamed, Telemetry& stats);
  // start_one_layer: issues the ring's first occupants that start left (no
  // wait for the compute stream: start's wait precedes them on the copy
  // stream); nothing when none are left.
  void issue_start_rest();
  // Runs `task` now, or posts it to the copy thread where there is one;
  // returns the number to wait_issued for (0: it ran).
  std::uint64_t issue(std::function<void()> task, bool wake = true);
  // Waits until `task` ran on the copy thread; rethrows what it threw.
  void wait_issued(std::uint64_t task);
  // Waits for every task posted (before the step's state changes).
  void drain_issued();
  void apply_copy_thread();  // starts or stops it as tuning_ says
  // Where a step's copies run, chosen by begin_step: on the CPU copy thread
  // (cpu_copy_thread, a step staging enough), on the forward's thread, or
  // issued on a device's copy streams. start, stage, write_back and
  // stage_ahead each go to the part for it.
  enum class StepCopies { kInline, kThread, kDevice };
  bool copies_on_thread() const { return step_copies_ == StepCopies::kThread; }
  void start_on_thread(Telemetry& stats);
  void start_on_device(Telemetry& stats);
  void stage_on_thread(std::int64_t streamed, Telemetry& stats);
  void stage_inline(std::int64_t streamed, Telemetry& stats);
  void stage_on_device(std::int64_t streamed, Telemetry& stats);
  void write_back_on_device(std::int64_t streamed, Telemetry& stats);
  void stage_ahead_on_thread(std::int64_t streamed, Telemetry& stats);
  void stage_ahead_on_device(std::int64_t streamed, std::optional<c10::Event> gathered, Telemetry& stats);
  // Bytes of `blocks` in one streamed layer's homes.
  std::int64_t layer_bytes_of(const std::vector<std::int64_t>& blocks) const {
    return static_cast<std::int64_t>(blocks.size()) * homes_->layer_bytes();
  }
  // CPU: a layer's staging and write-back, on the calling thread.
  void stage_cpu(std::int64_t streamed);
  void write_back_cpu(std::int64_t streamed);
  // CPU copy thread: posts, as one task, the write-back of streamed layer
  // `written` and the staging of streamed layer `staged` (-1: none; a staging
  // only where one is due and not yet posted, counted in `stats`).
  // `due`: stage() waits for it next (the thread is woken for it).
  void post_copies_cpu(std::int64_t written, std::int64_t staged, Telemetry* stats, bool due);
  bool posts_stage_cpu(std::int64_t streamed) const;
  // Posts the write-back write_back left for stage_ahead, if any.
  void post_written_back_cpu();
  // Moves the copy thread's time so far into the caller's counters.
  void take_copy_thread_time(Telemetry& stats);
  // Staging work this step: blocks to stage, or fresh blocks to zero.
  bool stages_this_step() const { return !stage_blocks_.empty() || !fresh_blocks_.empty(); }
  // Compressed homes: the step's fresh blocks (written, not staged) as zeros in
  // the buffer (CPU: now; device: on the current stream).
  void zero_fresh(std::int64_t streamed);
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
    return tuning_.settle_across_steps && streamed + geometry_.ring_size >= geometry_.num_streamed();
  }

  using PairRun = detail::PairRun;  // step_runs.h
  // CPU: a step's runs of consecutive home rows (inside a chunk) with their
  // blocks. Exact homes: a memcpy per stretch of consecutive block ids (a
  // copy_ pays ATen's dispatch each call, index_copy_ moves elements: both ran
  // at 2-5 GB/s a block at a time). Compressed homes: one slice of the ring
  // where the ids are consecutive, else the codec's batch by index.
  struct HomeRun {
    SlotRun rows;
    bool consecutive;
    std::vector<std::int64_t> blocks;
    std::optional<at::Tensor> ids;  // the blocks for an index copy (compressed homes)
  };
  // Between a run's home rows and its blocks in the ring, either way.
  void copy_run_cpu(std::int64_t streamed, const HomeRun& run, bool to_home);
  std::vector<HomeRun> home_runs(const std::vector<std::int64_t>& blocks,
                                 const std::vector<std::int64_t>& rows) const;
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
  // A contiguous ring buffer's blocks as rows of its widest word (a fill or
  // scatter moves a word per element).
  static at::Tensor ring_words(const at::Tensor& kv);
  // kCopyEngineBatch: a layer's runs between its homes and its ring buffer as
  // one batch, on `stream` (the copy stream, or the write-back stream).
  bool init_batch_copy();
  void batch_copy(std::int64_t streamed, const std::vector<PairRun>& runs, bool to_home,
                  const c10::Stream& stream, bool one_call = false);
  std::size_t batch_first_call() const { return static_cast<std::size_t>(tuning_.batch_first_call); }

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

  StreamingGeometry geometry_;
  std::unordered_map<std::string, std::int64_t> streamed_index_;
  std::vector<at::Tensor> streamed_kv_;  // per streamed layer: its view onto its ring buffer
  std::unique_ptr<HostArena> homes_;
  std::unique_ptr<KVCodec> codec_;  // compressed homes only; exact homes are the bytes
  std::unique_ptr<detail::CudaCodecKernels> codec_kernels_;  // compressed homes, CUDA, bf16
  std::string codec_kernels_missing_;
  std::int64_t fence_timeout_ms_;
  c10::Device device_{c10::DeviceType::CPU};
  std::optional<c10::Stream> copy_stream_;
  StreamCopy copy_method_ = StreamCopy::kRuns;
  bool device_gather_possible_ = false;
  bool batch_copy_possible_ = false;
  std::unique_ptr<detail::CopyBatch> batch_;     // kCopyEngineBatch: a layer's copies, reused
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
  StreamingTuning tuning_;
  // Per step (stages_by_pieces): the stage blocks in the pieces' order, and
  // the write-back split between the copy engine and the device's writes.
  detail::PieceOrder pieces_plan_;
  detail::WritebackSplit writeback_split_;
  std::vector<at::Tensor> pieces_;                     // device staging, [piece_rows, words] each
  std::vector<std::optional<c10::Event>> piece_free_;  // recorded on the copy stream after its scatter
  std::size_t next_piece_ = 0;
  std::optional<DeviceIndex> stage_index_;        // per step, made on first use
  std::optional<DeviceIndex> writeback_index_;    // the short write-back blocks
  std::optional<at::Tensor> writeback_long_ids_;  // device int64: writeback_long_blocks_

  // Per step.
  std::vector<std::int64_t> stage_blocks_, stage_rows_;
  std::vector<std::int64_t> writeback_blocks_, writeback_rows_;
  // Compressed homes: the blocks the step writes and does not stage. A head
  // vector of some layouts (vLLM's CPU cache keeps K transposed) spans several
  // tokens, so a partly filled block's encode must not see the buffer's
  // previous occupant in its unused slots.
  std::vector<std::int64_t> fresh_blocks_;
  std::optional<at::Tensor> fresh_ids_;  // on the ring's device, made on first use
  std::vector<PairRun> stage_runs_;      // kRuns on a device
  std::vector<PairRun> writeback_runs_;
  std::vector<HomeRun> stage_home_runs_, writeback_home_runs_;  // CPU
  std::vector<char> stage_issued_;                              // per streamed layer (device)
  std::vector<char> staged_;                                    // per streamed layer: stage() done this step
  std::vector<std::optional<c10::Event>> stage_fences_;         // per streamed layer (device)
  std::vector<std::uint64_t> stage_tasks_;  // per streamed layer: the task issuing its staging
  // start_one_layer: streamed layers [1, start_rest_end_) are marked issued by
  // start but not yet issued (0: none).
  std::int64_t start_rest_end_ = 0;
  // tuning_.issue_thread on CUDA; tuning_.cpu_copy_thread on CPU, where it
  // runs the copies themselves on copy_thread_cpus_.
  std::unique_ptr<detail::CopyThread> copy_thread_;
  std::vector<int> copy_thread_cpus_;
  // The copy thread's time, not yet in a Telemetry: the next stage or
  // write_back counts it, so a step's last copies count in the next step.
  std::atomic<std::int64_t> copy_thread_us_{0};
  StepCopies step_copies_ = StepCopies::kInline;  // set by begin_step
  std::int64_t written_back_ = -1;                // CPU copy thread: the write-back not yet posted
  // CPU copy thread, per step: the streamed layer stage() is called for next,
  // and the first whose staging was posted without waking the thread (-1: none).
  std::int64_t next_stage_ = 0;
  std::int64_t not_woken_for_ = -1;
  // Per step: no block is both staged and written back (set by begin_step).
  bool stage_writeback_disjoint_ = false;
  // Per streamed layer: the write-back of the ring buffer's previous occupant
  // (settle_across_steps: for a first occupant, the last step's), which the
  // layer's compute waits for.
  std::vector<std::shared_ptr<c10::Event>> occupant_writeback_;
  std::vector<std::uint64_t> occupant_writeback_tasks_;  // the tasks recording them
  // settle_across_steps, set by the tasks issuing write-backs and stagings:
  // per ring buffer its last use, per streamed layer its homes' last
  // write-back while it may run; each taken by the next staging that needs it.
  std::vector<BufferLastUse> buffer_last_use_;
  std::vector<std::shared_ptr<c10::Event>> home_writeback_;
  std::uint64_t step_ = 0;  // begin_step's count
  // Per step: settle_across_steps, and the last step reached every buffer's
  // last occupant, so this one's stagings wait for those alone.
  bool from_last_step_ = false;

  SettleQueue<PendingWriteback> pending_writebacks_;
  // Per streamed layer and home row ([layer * num_rows + row]): the row's
  // bytes are unknown (a write-back fence with an unknown outcome).
  std::vector<char> poisoned_;
  std::vector<std::int64_t> poisoned_stages_;
};

}  // namespace activekv
