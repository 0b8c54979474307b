// Worker side: owns the host arena and moves blocks between it and the paged
// KV cache. Mirrors the reference (worker.py) step by step:
//   start_load          check each load's slot holds the expected block, then per
//                       layer copy the slots' rows to a device staging region,
//                       one copy per run of consecutive slots (on a load stream
//                       where the device has streams);
//   wait_for_layer_load make the compute stream wait for that layer's copy, then
//                       decode and scatter the rows into the paged cache;
//   save_layer          gather the layer's blocks on the device and encode them
//                       (on a gather stream that first waits for the compute
//                       stream), then copy them straight into their arena
//                       slots, one copy per run (on a save stream that waits
//                       for the gather); the slots are leased, so nothing
//                       reads them;
//   wait_for_save       make the compute stream wait for the step's gathers
//                       (so vLLM may overwrite the blocks), and leave the
//                       copies to the host running: the step's save is
//                       pending. Pending saves settle in take_report (or
//                       drain_saves): once their fences completed the slots
//                       are sealed through the step's lease and reported
//                       saved; a fence with an unknown outcome (error, or not
//                       done within fence_timeout_ms of wait_for_save)
//                       quarantines the lease: its slots are reported, never
//                       reused, never sealed.
// The save slots are taken as one lease in bind_plan: unsealed at once (so no
// load reads them), sealed only by that lease after its fence completed, so a
// block is visible only after its save completed. Copies of one step thus
// overlap the next step's loads. On CPU everything is immediate: a save
// settles inside wait_for_save.
// Asynchronous loads (StepPlan::async_loads, config.async_load_min_tokens):
// start_load issues each request's loads on a stream of their own, after the
// work already queued on the compute stream (a block vLLM just gave the
// request may still be written by a step in flight), landing them there
// through their own staging ring; take_landed_requests names a request once
// all its copies completed, and only then reports its slots read. vLLM keeps
// the request out of every batch until then, so no event joins the compute
// stream. On the CPU they land inside start_load.
// Layer streaming (layer_streaming.h), when a geometry is given: bind_plan
// begins the streamer's step, wait_for_layer_load stages the layer's blocks
// before the step's loads land on top, save_layer writes the layer's blocks
// back before the store save gathers its own.
// A step that replays a full CUDA graph runs no per-layer hook: start_load is
// told so and lands every layer's loads before the forward, and wait_for_save
// gathers the layers save_layer never saw. Streaming needs the hooks, so with
// it vLLM captures piecewise graphs only.
// Device-generic: c10 streams and events only; on CPU everything is immediate.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "activekv/config.h"
#include "activekv/host_arena.h"
#include "activekv/kv_codec.h"
#include "activekv/kv_layout.h"
#include "activekv/layer_streaming.h"
#include "activekv/load_pieces.h"
#include "activekv/settle_queue.h"
#include "activekv/step_plan.h"
#include "activekv/telemetry.h"

namespace activekv {

class WorkerSide {
 public:
  WorkerSide(const Config& config, KVLayout layout, std::int64_t num_slots, std::int64_t tp_rank,
             std::optional<StreamingGeometry> streaming = std::nullopt);
  ~WorkerSide();
  WorkerSide(const WorkerSide&) = delete;
  WorkerSide& operator=(const WorkerSide&) = delete;

  // How many workers the vLLM instance runs on this host (tensor x pipeline x
  // local data parallel). Call before register_kv_caches. Beside more than
  // one, a CPU streamer keeps its copies on the forward's thread: the CPUs its
  // own forward leaves may be other workers' forwards'
  // (StreamingTuning::cpu_copy_thread).
  void set_workers(std::int64_t workers) { workers_ = workers; }

  // The host store goes into this rank's store file at `path`
  // (store_file.h, store_file_of_rank), whose header must say `identity` (the
  // model's identity digest, mode, dtype; register_kv_caches adds the blocks'
  // shape and strides). Call before register_kv_caches; without it the store
  // lives in process memory.
  void use_store_file(std::string path, std::string identity) {
    store_path_ = std::move(path);
    store_identity_ = std::move(identity);
  }
  // On a device, a step's loads cross in pieces (load_pieces.h) through a ring
  // of `pieces` staging buffers of at most `piece_bytes` each, which
  // register_kv_caches allocates: the device memory loads take beyond vLLM's
  // KV cache, whatever a request's size (the default: kLoadStagingPieces of
  // kLoadStagingPieceBytes). Call before register_kv_caches. On the CPU the
  // blocks are read where they lie.
  // Asynchronous loads take a ring of kAsyncLoadStagingPieces more of the
  // same size, when config.async_load_min_tokens is above 0.
  static constexpr std::int64_t kLoadStagingPieces = 3;
  static constexpr std::int64_t kAsyncLoadStagingPieces = 2;
  static constexpr std::int64_t kLoadStagingPieceBytes = std::int64_t{64} << 20;
  void set_load_staging(std::int64_t pieces, std::int64_t piece_bytes);
  // The device memory the load staging took (0 on the CPU).
  std::int64_t load_staging_bytes() const;
  // Must be called once, before any step. Errors name the layer or shape, or
  // the store file and what to do.
  Status register_kv_caches(const std::unordered_map<std::string, at::Tensor>& kv_caches);
  // One line on the device memory the loads stage through (empty on the CPU).
  std::string load_staging_line() const;
  // One line on the store file's recovery (empty without a store file).
  std::string store_file_line() const;
  // One line on how layer streaming's homes and ring cross (empty without
  // streaming): on CUDA it says whether the copy engines do it all or the
  // driver lacked the batched copy; and, on a device, whether write-backs
  // settle across steps (StreamingTuning::settle_across_steps).
  std::string streaming_copies_line() const;
  // The store file's data (StoreFile::data), or nullptr without store_path:
  // the binding registers it with the device where the device can.
  const StoreFile* store_file() const;

  // The step's plan, bound before the forward and cleared after wait_for_save.
  // Throws std::out_of_range (and binds nothing) for a block id or slot
  // outside the KV cache or the arena (stage and write-back blocks included).
  void bind_plan(StepPlan plan);
  void clear_plan() {
    plan_.reset();
    step_loads_ = LoadBatch{};
  }
  // Cheap questions, so the binding skips idle calls without crossing into
  // native work (vLLM calls these every step, for every layer).
  bool loads_this_step() const { return plan_ && !plan_->loads.empty(); }
  bool async_loads_this_step() const { return plan_ && !plan_->async_loads.empty(); }
  // Loads that land layer by layer (wait_for_layer_load), not all in start_load.
  bool staged_loads_this_step() const { return step_loads_.landing(); }
  bool saves_this_step() const { return plan_ && !plan_->saves.empty(); }
  // Whether the bound step stages or writes back streamed layers' blocks.
  bool streams_this_step() const { return plan_ && streamer_ && streamer_->moves_blocks_this_step(); }
  // Whether wait_for_layer_load may have anything to do this step.
  bool layer_waits_this_step() const { return staged_loads_this_step() || streams_this_step(); }
  // vLLM's has_layer_work hook (the series' patch 0001), by its name.
  bool has_layer_work() const { return loads_this_step() || saves_this_step() || streams_this_step(); }
  bool streaming() const { return streaming_.has_value(); }
  // Nothing for get_finished to tell: no finished request kept for its saves,
  // no asynchronous load issued and not yet named.
  bool nothing_awaiting() const { return awaiting_free_.empty() && async_loads_.empty(); }

  // layer_hooks: whether wait_for_layer_load runs this step (not under a full
  // CUDA graph); without it every layer's loads land here.
  void start_load(bool layer_hooks = true);
  void wait_for_layer_load(const std::string& layer_name);
  void save_layer(const std::string& layer_name, const at::Tensor& kv_layer);
  void wait_for_save();
  // Waits for every pending save to settle (each at most until its deadline).
  void drain_saves() { settle_saves(/*wait=*/true); }
  bool has_pending_saves() const { return !pending_saves_.empty(); }

  // Requests the scheduler kept for their saves that can now be released.
  std::vector<std::string> get_finished(const std::vector<std::string>& finished_req_ids);
  // Requests whose asynchronous loads all completed (failed ones included)
  // since the last call, in issue order; their slots join the report.
  std::vector<std::string> take_landed_requests();
  std::vector<std::int64_t> take_load_errors();
  WorkerReport take_report();
  // The counters since the last take (vLLM takes once a step) and, with
  // streaming, the gauges of the step's streamed bytes each way.
  Telemetry take_telemetry() {
    if (streaming_) {
      stats_.set(Gauge::kStreamedStepBytesToDevice,
                 static_cast<double>(stats_.get(Counter::kStreamedBytesToDevice)));
      stats_.set(Gauge::kStreamedStepBytesToHost,
                 static_cast<double>(stats_.get(Counter::kStreamedBytesToHost)));
    }
    return stats_.take();
  }
  std::int64_t tp_rank() const { return tp_rank_; }

  // What a sealed slot records: the block key and this worker's TP rank
  // (36 bytes: a store file's tag).
  std::string tag(const BlockKey& key) const;
  HostArena* arena() { return arena_.get(); }
  LayerStreamer* streamer() { return streamer_.get(); }

 private:
  // streaming_copies_line's first part: by what the homes and the ring cross.
  std::string copies_by() const;
  // CPU: where the copy thread runs (StreamingTuning::cpu_copy_thread), if one does.
  std::string copy_thread() const;
  Status open_store_file(const std::vector<std::int64_t>& block_shape);
  // A step's save after wait_for_save, until its fences settle it.
  struct PendingSave {
    SlotLease lease;
    std::vector<std::string> tags;  // one per leased slot
    std::vector<c10::Event> fences;
    bool whole = false;  // every layer was gathered
    std::chrono::steady_clock::time_point deadline;
  };
  // Device staging buffers; each free again once the stream that lands
  // from it passed its event.
  struct StagingRing {
    std::vector<at::Tensor> buffers;
    std::vector<std::optional<c10::Event>> free;
  };
  // Loads crossing in pieces (load_pieces.h): on a device through a ring.
  struct LoadBatch {
    std::vector<SlotRun> runs;      // their slots, in load order
    std::vector<std::int64_t> ids;  // their block ids, in load order
    at::Tensor block_ids;           // the same, on the device
    std::vector<detail::LoadPiece> pieces;
    std::vector<std::optional<c10::Event>> ready;  // per piece (device)
    std::size_t issued = 0;
    std::size_t landed = 0;
    bool landing() const { return landed < pieces.size(); }
  };
  // The copy and landing streams of one kind of load, and its ring.
  struct LoadLane {
    StagingRing* ring;
    c10::Stream copy;
    c10::Stream land;
  };
  // A request's asynchronous loads, from start_load until all landed.
  struct AsyncLoadInFlight {
    std::string req_id;
    WorkerReport report;  // its slots: loaded, failed
    LoadBatch batch;      // kept until done: its block ids are in use
    std::optional<c10::Event> done;
  };
  // Checks each load's slot holds its block (else records a failed load into
  // `report` and the block as a load error) and starts the batch of the good
  // ones: on a device (`lane`), its block ids made on the landing stream and
  // the ring's buffers given its first pieces.
  LoadBatch started_batch(const std::vector<LoadOp>& ops, WorkerReport& report,
                          const std::optional<LoadLane>& lane);
  // Lands (decodes into vLLM's KV cache) the batch's pieces in order through
  // layer `layer`'s last, issuing the next pieces into the buffers they free.
  void land_through(LoadBatch& batch, std::int64_t layer, const std::optional<LoadLane>& lane);
  void issue_piece(LoadBatch& batch, const LoadLane& lane);
  void start_async_loads();
  std::optional<LoadLane> step_lane();
  Status allocate_ring(StagingRing& ring, std::int64_t pieces);  // on a device
  void settle_saves(bool wait);
  // The store's part of save_layer; `gathered` is set when a device gather ran.
  void store_save_layer(const std::string& layer_name, const at::Tensor& kv_layer,
                        std::optional<c10::Event>& gathered);
  // Its fences' outcome: done (true), unknown (false: a fence failed, or one
  // still runs past the deadline), or still running (nullopt; only when not
  // `wait`: waiting, each fence is waited for until the deadline).
  static std::optional<bool> outcome(const PendingSave& p, bool wait);
  void settle(PendingSave& p, bool done);  // seals, fails or quarantines it

  bool has_streams() const { return device_.type() != c10::DeviceType::CPU; }
  at::Tensor block_ids_tensor(const std::vector<std::int64_t>& ids) const;

  Config config_;
  KVLayout layout_;
  std::int64_t num_slots_;
  std::int64_t tp_rank_;
  std::int64_t workers_ = 1;
  std::string store_path_;  // empty: the store lives in process memory
  std::string store_identity_;
  std::int64_t layer_bytes_;
  std::unordered_map<std::string, std::int64_t> layer_index_;
  std::unordered_map<std::string, at::Tensor> kv_;
  c10::Device device_{c10::DeviceType::CPU};
  std::int64_t num_device_blocks_ = 0;
  std::unique_ptr<KVCodec> codec_;
  std::unique_ptr<HostArena> arena_;
  std::optional<StreamingGeometry> streaming_;
  std::unique_ptr<LayerStreamer> streamer_;  // made by register_kv_caches
  std::optional<c10::Stream> load_stream_;
  std::optional<c10::Stream> save_stream_;
  std::optional<c10::Stream> gather_stream_;  // a save's gather and encode
  Telemetry stats_;

  std::int64_t staging_pieces_ = kLoadStagingPieces;
  std::int64_t staging_piece_bytes_ = kLoadStagingPieceBytes;
  StagingRing step_ring_;  // the step's loads, landed by the compute stream
  LoadBatch step_loads_;
  // Asynchronous loads: their ring, copy and landing streams, and what runs.
  StagingRing async_ring_;
  std::optional<c10::Stream> async_copy_stream_;
  std::optional<c10::Stream> async_land_stream_;
  std::deque<AsyncLoadInFlight> async_loads_;
  std::optional<StepPlan> plan_;
  SlotLease save_lease_;
  std::vector<SlotRun> save_runs_;
  at::Tensor save_block_ids_;  // on the device, made once per step
  std::set<std::string> saved_layers_;
  std::vector<c10::Event> save_fences_;
  SettleQueue<PendingSave> pending_saves_;
  std::vector<char> in_flight_;  // per slot: in a pending save
  WorkerReport report_;
  std::vector<std::int64_t> load_error_blocks_;
  std::set<std::string> awaiting_free_;
  std::deque<std::string> recent_finished_;
};

}  // namespace activekv
