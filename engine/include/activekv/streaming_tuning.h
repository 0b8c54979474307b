// Layer streaming's knobs (layer_streaming.h), one line of contract each.
// Defaults are the H200's measurements; each knob's figures are in
// docs/benchmarks/history.md under the date given. Benchmarks and the device
// check sweep them (LayerStreamer::set_tuning); vLLM runs the defaults.
#pragma once

#include <cstdint>

namespace activekv {

struct StreamingTuning {
  // Staging pieces in flight: 8 lets the bus read on through a prefill
  // chunk's attention (64k-128k prefill 1.05-1.07x its bound, 4: 1.13-1.32x; 2026-12-03).
  std::int64_t pieces = 8;
  // Bytes a staging piece: 32 MiB, ~0.6 ms of PCIe Gen5, hides a piece's fixed costs.
  std::int64_t piece_bytes = std::int64_t{32} << 20;
  // Runs of at least this many consecutive blocks cross by the copy engine, not the gather.
  std::int64_t copy_engine_run = 16;
  // The gather stream at high priority: its thread blocks go first as SMs free up.
  bool gather_high_priority = true;
  // The copy stream at high priority (off: its scatters wait for attention's last wave).
  bool copy_high_priority = false;
  // kCopyEngineBatch: write-backs on a stream of their own, so the bus's two directions overlap.
  bool writeback_stream = true;
  // CUDA: a thread of its own issues the copy streams' work (copy_thread.h).
  // Off: at a ring of 2 it read no faster on the H200; at 3 it did (2026-12-04).
  bool issue_thread = false;
  // kCopyEngineBatch: a batch goes to the driver in calls of this many copies,
  // doubling each call, so the bus starts early (cuda_batch_copy.h); 0: one call.
  std::int64_t batch_first_call = 32;
  // kCopyEngineBatch: a staging issued ahead of its layer goes in one call
  // (0.99 of the bus against 0.97 in calls at 16k; 2026-12-04).
  bool ahead_in_one_call = true;
  // Device: write-backs settle across steps, ordered on the device instead of
  // waited for on the host at begin_step (prefill back to back 1.005-1.024x its
  // bound, 1.025-1.055x without; 2026-12-05). Off with ACTIVEKV_SETTLE_ACROSS_STEPS=0.
  bool settle_across_steps = true;
  // CUDA compressed homes: decoded and encoded by two fused kernels compiled
  // at start (NVRTC), not ~15 ATen kernels a layer.
  bool fused_codec = true;
  // CPU exact homes: copies on a thread pinned to CPUs the forward may not use
  // (off with ACTIVEKV_CPU_COPY_THREAD=0; =all sets the next knob to 0).
  bool cpu_copy_thread = true;
  // cpu_copy_thread: steps staging less than this a layer copy on the forward's
  // thread (waking the thread costs ~8 us, memcpy of ~350 KB; 2026-12-05).
  std::int64_t cpu_copy_thread_min_bytes = std::int64_t{768} << 10;
};

}  // namespace activekv
