// Layer streaming: contexts longer than the device's KV memory. Mirrors the
// reference (reference/activekv_reference/streaming.py). This header is the
// streamer that coordinates a step (layer_streaming.cpp); its copies between
// the homes and the ring go through one copier chosen at creation by the
// ring's device (engine/src/ring_copies.h): the CPU's (cpu_ring_copies.h) or
// a device's (device_ring_copies.h). Which layers are resident and which
// buffer a streamed layer uses is streaming_geometry.h.
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

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "activekv/config.h"
#include "activekv/streaming_tuning.h"
#include "activekv/host_arena.h"
#include "activekv/status.h"
#include "activekv/streaming_geometry.h"
#include "activekv/telemetry.h"

namespace activekv {
namespace detail {
struct StreamedRing;
class RingCopies;
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
// wait_for_layer_load's call, write_back in save_kv_layer's; beside a bound
// forward a copy thread of their own makes them ahead (cpu_copy_thread). On a
// device (CUDA, XPU) a copy stream carries them, ordered against the compute
// stream by fences (src/device_ring_copies.h has the order). A write-back's
// fence is settled at the next begin_step (waiting at most fence_timeout_ms
// past the step; with settle_across_steps, at the first begin_step that finds
// it done or past that deadline); one with an unknown outcome poisons its
// blocks' homes, and a later step that stages a poisoned block reports it as a
// load error (vLLM then recomputes the request).
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

  const StreamingGeometry& geometry() const;
  HostArena& homes();
  StreamCopy copy_method() const;
  // Whether this streamer's device, homes and ring allow `method`
  // (kDeviceGather: a device that maps pinned memory, whole-row blocks;
  // kCopyEngineBatch: that on CUDA with the batched copy).
  bool can_copy_by(StreamCopy method) const;
  // For benchmarks and tests comparing the methods; std::invalid_argument
  // where !can_copy_by(method). Must be called between steps.
  void set_copy_method(StreamCopy method);
  const StreamingTuning& tuning() const;
  // CPU: the CPUs the copy thread runs on (cpu_copy_thread); empty where the
  // copies run on the forward's thread.
  const std::vector<int>& copy_thread_cpus() const;
  // Compressed homes on CUDA: whether the fused codec kernels were compiled,
  // and if not, why (empty where they do not apply).
  bool has_fused_codec() const;
  const std::string& fused_codec_missing() const;
  // Between steps; std::invalid_argument for a knob out of range. Takes
  // `tuning` as it is: the constructor's rules for settle_across_steps (off
  // without streams, or with the environment's =0) and cpu_copy_thread apply
  // to the streamer's own tuning, so start from tuning() to keep them.
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
  bool moves_blocks_this_step() const;
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
  LayerStreamer(std::unique_ptr<detail::StreamedRing> ring, std::int64_t fence_timeout_ms,
                std::int64_t head_size, std::int64_t workers);
  // The index among the streamed layers of layer `name`; nothing for a resident layer.
  std::optional<std::int64_t> streamed(const std::string& name) const;
  // The stage blocks whose home rows are poisoned, noted at begin_step.
  void note_poisoned_stages();

  std::unique_ptr<detail::StreamedRing> ring_;  // the layers, their homes, the step's blocks
  std::unique_ptr<detail::RingCopies> copies_;  // the ring's copier, for its device
  std::unordered_map<std::string, std::int64_t> streamed_index_;
  std::vector<char> staged_;  // per streamed layer: stage() done this step
  std::vector<std::int64_t> poisoned_stages_;
};

}  // namespace activekv
