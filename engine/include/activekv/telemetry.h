// Telemetry counters, the same names as the Python reference (stats.py).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace activekv {

enum class Counter : int {
  kLookups,
  kHitBlocks,
  kHitTokens,
  kStoredBlocks,
  kEvictedBlocks,
  kRejectedThreshold,
  kRejectedRequestCap,
  kRejectedFull,
  kSavedBlocks,
  kLoadedBlocks,
  kFailedLoads,
  kBytesToHost,
  kBytesToDevice,
  kSaveUs,
  kLoadUs,
  kQuarantinedFences,
  kStreamedBytesToDevice,
  kStreamedBytesToHost,
  kStreamUs,
  // The streaming geometry (StartupReport), counted once by the scheduler at
  // start-up, so each reads as its value in the stats and in Prometheus.
  kStreamingResidentLayers,
  kStreamingStreamedLayers,
  kStreamingRingSize,
  kStreamingDeviceBlocks,
  kStreamingDeviceBlocksWithout,
  kStreamingHostBytes,
  kStreamingDecodeStepBytes,
  kCount,
};

inline constexpr std::array<std::string_view, static_cast<int>(Counter::kCount)> kCounterNames = {
    "lookups",       "hit_blocks",     "hit_tokens",        "stored_blocks",
    "evicted_blocks", "rejected_threshold", "rejected_request_cap", "rejected_full",
    "saved_blocks",  "loaded_blocks",  "failed_loads",      "bytes_to_host",
    "bytes_to_device", "save_us",      "load_us",           "quarantined_fences",
    "streamed_bytes_to_device", "streamed_bytes_to_host", "stream_us",
    "streaming_resident_layers", "streaming_streamed_layers", "streaming_ring_size",
    "streaming_device_blocks", "streaming_device_blocks_without", "streaming_host_bytes",
    "streaming_decode_step_bytes"};

class Telemetry {
 public:
  void add(Counter c, std::int64_t v) { counts_[static_cast<std::size_t>(c)] += v; }
  std::int64_t get(Counter c) const { return counts_[static_cast<std::size_t>(c)]; }
  bool empty() const {
    for (auto v : counts_) {
      if (v != 0) return false;
    }
    return true;
  }
  // The counts since the last take.
  Telemetry take() {
    Telemetry out = *this;
    counts_.fill(0);
    return out;
  }

 private:
  std::array<std::int64_t, static_cast<std::size_t>(Counter::kCount)> counts_{};
};

}  // namespace activekv
