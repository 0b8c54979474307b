// The worker's start-up lines: the device memory its loads stage through,
// what its store file recovered, and by what layer streaming moves the homes
// and the ring (the copy method LayerStreamer chose, and why where another
// was possible).
#include "activekv/worker_side.h"

#include "cuda_batch_copy.h"

#include <cstdio>
#include <string>
#include <vector>

namespace activekv {

std::string WorkerSide::load_staging_line() const {
  const std::vector<at::Tensor>& staging = step_ring_.buffers;
  if (staging.empty()) return "";
  const auto bytes = static_cast<double>(staging.front().numel());
  char size[32];
  if (bytes >= (1 << 20)) {
    std::snprintf(size, sizeof size, "%.1f MiB", bytes / (1 << 20));
  } else {
    std::snprintf(size, sizeof size, "%.1f KiB", bytes / (1 << 10));
  }
  const std::string async_loads = async_ring_.buffers.empty()
                                      ? "; every hit lands inside its step"
                                      : "; hits of " + std::to_string(config_.async_load_min_tokens) +
                                            " tokens or more land asynchronously, through " +
                                            std::to_string(async_ring_.buffers.size()) + " more";
  return "ActiveKV loads (rank " + std::to_string(tp_rank_) + "): staged through " +
         std::to_string(staging.size()) + " buffers of " + size + " on " + device_.str() +
         " (pieces of at most " + std::to_string(staging.front().size(0)) + " blocks)" + async_loads +
         ", beside vLLM's KV cache";
}

std::string WorkerSide::store_file_line() const {
  const StoreFile* f = arena_ ? arena_->file() : nullptr;
  if (f == nullptr) return "";
  const std::string head =
      "ActiveKV host store file " + store_path_ + " (rank " + std::to_string(tp_rank_) + "): ";
  if (f->joined()) {  // a live vLLM recovered it; its slots are as that one keeps them
    std::int64_t sealed = 0;
    for (std::int64_t s = 0; s < f->num_slots(); ++s) sealed += f->sealed(s) ? 1 : 0;
    return head + "joined the running vLLM instance(s) that hold it, " + std::to_string(sealed) +
           " blocks sealed";
  }
  return head + std::to_string(f->recovered().size()) + " blocks came back; dropped " +
         std::to_string(f->dropped_writing()) + " unfinished and " + std::to_string(f->dropped_checksum()) +
         " whose bytes did not verify";
}

std::string WorkerSide::streaming_copies_line() const {
  if (!streamer_) return "";
  // CPU copies have landed by the next step: nothing to say there.
  std::string settle;
  if (has_streams()) {
    settle = streamer_->tuning().settle_across_steps
                 ? "; write-backs settle across steps"
                 : "; write-backs settle on the host each step (ACTIVEKV_SETTLE_ACROSS_STEPS=0)";
  }
  return copies_by() + settle;
}

std::string WorkerSide::copy_thread() const {
  const std::vector<int>& cpus = streamer_->copy_thread_cpus();
  if (cpus.empty()) return "";
  std::string list;
  for (const int c : cpus) {
    if (!list.empty()) list += ',';
    list += std::to_string(c);
  }
  const std::int64_t kib = streamer_->tuning().cpu_copy_thread_min_bytes >> 10;
  return ", on a copy thread on CPUs " + list + ", beside the forward's, in steps staging " +
         std::to_string(kib) + " KiB a layer or more";
}

std::string WorkerSide::copies_by() const {
  const std::string head = "ActiveKV layer streaming (rank " + std::to_string(tp_rank_) + "): ";
  // Compressed homes are decoded on the device: by which kernels, and why.
  std::string decoded;
  if (streamer_->geometry().homes == Mode::kCompressed) {
    decoded = "compressed homes are decoded on the device";
    if (streamer_->has_fused_codec()) {
      decoded += ", by fused kernels compiled at start";
    } else if (!streamer_->fused_codec_missing().empty()) {
      decoded += ", by ATen operations: no fused kernels, " + streamer_->fused_codec_missing();
    }
  }
  switch (streamer_->copy_method()) {
    case StreamCopy::kCopyEngineBatch:
      if (!decoded.empty()) {
        return head +
               "the copy engines move the homes' rows through staging pieces, one batched copy a piece "
               "or write-back (" +
               decoded + ")";
      }
      return head + "the copy engines move the homes' blocks, one batched copy a layer each way";
    case StreamCopy::kDeviceGather: {
      // Where a batch could have moved them, they were under the size a gather moves faster.
      const std::string under = " under " + std::to_string(detail::kMinBatchCopyBytes >> 10) + " KiB";
      std::string why;
      if (!decoded.empty()) {
        const bool batch_possible = streamer_->can_copy_by(StreamCopy::kCopyEngineBatch);
        why = batch_possible ? " (rows" + under + ", which a gather moves faster; " : " (";
        why += decoded + ")";
      } else if (streamer_->can_copy_by(StreamCopy::kCopyEngineBatch)) {
        why = " (blocks" + under + ", which a gather moves faster)";
      } else if (device_.is_cuda()) {
        why = " (this CUDA driver has no batched copy; 12.8 and later have it)";
      }
      return head + "a gather kernel reads the homes into staging pieces" + why;
    }
    case StreamCopy::kRuns:
      return head + "one copy per run of home rows and blocks" +
             (device_.is_cpu() ? copy_thread() : " (the ring's blocks are not whole rows)");
  }
  return head;
}

}  // namespace activekv
