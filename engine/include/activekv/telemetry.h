// Telemetry: counters and gauges, the same names as the Python reference
// (stats.py). docs/metrics.md says what each means and how Prometheus shows it.
//
// A counter counts what happened since the last take. A gauge is a value now
// (the host store's fill, the last step's streamed bytes): a take reports it
// only when it differs from what the previous take reported, so an idle step
// sends nothing. Each take has a number (seq, 1, 2, ...): where vLLM merges
// several steps' stats of one side, the latest gauge value wins
// (metrics.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace activekv {

enum class Counter : int {
  kLookups,
  kLookupTokens,
  kHitBlocks,
  kHitTokens,
  kStoredBlocks,
  kEvictedBlocks,
  kRejectedThreshold,
  kRejectedRequestCap,
  kRejectedFull,
  kSavedBlocks,
  kLoadedBlocks,
  kAsyncLoadedBlocks,
  kFailedLoads,
  kBytesToHost,
  kBytesToDevice,
  kSaveUs,
  kLoadUs,
  kQuarantinedFences,
  kStreamedBytesToDevice,
  kStreamedBytesToHost,
  kStreamUs,
  kCount,
};

inline constexpr std::array<std::string_view, static_cast<int>(Counter::kCount)> kCounterNames = {
    "lookups",
    "lookup_tokens",
    "hit_blocks",
    "hit_tokens",
    "stored_blocks",
    "evicted_blocks",
    "rejected_threshold",
    "rejected_request_cap",
    "rejected_full",
    "saved_blocks",
    "loaded_blocks",
    "async_loaded_blocks",
    "failed_loads",
    "bytes_to_host",
    "bytes_to_device",
    "save_us",
    "load_us",
    "quarantined_fences",
    "streamed_bytes_to_device",
    "streamed_bytes_to_host",
    "stream_us"};

// Prometheus's HELP of each counter (the reference's COUNTERS, word for word).
inline constexpr std::array<std::string_view, static_cast<int>(Counter::kCount)> kCounterHelp = {
    "Requests looked up in the host store",
    "Tokens the host store could have served to the requests looked up "
    "(full prompt blocks past vLLM's own prefix hit)",
    "Blocks served from the host store",
    "Tokens served from the host store",
    "Blocks whose save completed and became visible",
    "Blocks evicted from the host store (LRU)",
    "Blocks not stored: seen fewer times than store_threshold",
    "Blocks not stored: request over max_bytes_per_request",
    "Blocks not stored: every slot pending or pinned",
    "Blocks written to host memory by workers",
    "Blocks read from host memory by workers",
    "Of loaded_blocks, those loaded while vLLM kept their request out of the batch (async_load_min_tokens)",
    "Blocks whose load failed (recomputed by vLLM)",
    "Bytes written to the host store",
    "Bytes read from the host store",
    "Microseconds the workers spent saving blocks (on a GPU: issuing copies that run on a copy stream)",
    "Microseconds the workers spent loading blocks (on a GPU: issuing copies that run on a copy stream)",
    "Transfer fences with an unknown outcome; their staging is never reused",
    "Layer streaming: bytes staged from the homes into the ring",
    "Layer streaming: bytes written back from the ring to the homes",
    "Layer streaming: microseconds spent staging and writing back"};

// Byte gauges are of every tensor-parallel worker of the vLLM instance
// together (the host store's capacity_bytes is per worker).
enum class Gauge : int {
  // The scheduler's: the host store (its index) after the step.
  kStoreBlocks,         // blocks visible to lookups
  kStoreUsedBytes,      // slots not free (stored, being saved, quarantined)
  kStoreFreeBytes,      // free slots
  kStoreCapacityBytes,  // every slot
  kStoreHitRatio,       // hit_tokens / lookup_tokens since start-up
  // Each worker's: layer streaming's bytes of the step.
  kStreamedStepBytesToDevice,
  kStreamedStepBytesToHost,
  // The scheduler's, once at start-up: the streaming geometry (StartupReport).
  kStreamingStreamedLayers,
  kStreamingDeviceBlocks,
  kStreamingDeviceBlocksWithout,
  kStreamingHostBytes,
  kStreamingDecodeStepBytes,
  kCount,
};

inline constexpr std::array<std::string_view, static_cast<int>(Gauge::kCount)> kGaugeNames = {
    "store_blocks",
    "store_used_bytes",
    "store_free_bytes",
    "store_capacity_bytes",
    "store_hit_ratio",
    "streamed_step_bytes_to_device",
    "streamed_step_bytes_to_host",
    "streaming_streamed_layers",
    "streaming_device_blocks",
    "streaming_device_blocks_without",
    "streaming_host_bytes",
    "streaming_decode_step_bytes"};

// Prometheus's HELP of each gauge (the reference's GAUGES, word for word).
inline constexpr std::array<std::string_view, static_cast<int>(Gauge::kCount)> kGaugeHelp = {
    "Blocks in the host store that lookups find",
    "Host store bytes taken (stored blocks, saves in flight, quarantined slots), all workers",
    "Host store bytes free, all workers",
    "Host store bytes in all (whole blocks of capacity_bytes), all workers",
    "Host store hit ratio since start-up: hit_tokens / lookup_tokens",
    "Layer streaming: bytes staged from the homes into the ring in the last step, all workers",
    "Layer streaming: bytes written back from the ring to the homes in the last step, all workers",
    "Layer streaming: layers whose KV lives in host memory",
    "Layer streaming: KV cache blocks the device holds",
    "Layer streaming: blocks the same memory holds without streaming",
    "Layer streaming: host bytes reserved for the streamed layers' homes, all workers",
    "Layer streaming: host-to-device bytes of a full-context decode step, all workers"};

// Whether a gauge's value is a fraction (else a whole number).
constexpr bool gauge_is_ratio(Gauge g) { return g == Gauge::kStoreHitRatio; }

// The info metric's name and labels (vllm:activekv_config_info): the
// configuration, set once per engine (metrics.cpp).
inline constexpr std::string_view kConfigInfoName = "config_info";
inline constexpr std::string_view kConfigInfoHelp =
    "ActiveKV's configuration (kv_connector_extra_config) in its labels; the value is 1";
inline constexpr std::array<std::string_view, 12> kConfigInfoLabels = {"mode",
                                                                       "capacity_bytes",
                                                                       "store_threshold",
                                                                       "max_bytes_per_request",
                                                                       "store_blocks",
                                                                       "fence_timeout_ms",
                                                                       "store_path_set",
                                                                       "streaming",
                                                                       "resident_layers",
                                                                       "ring_size",
                                                                       "homes",
                                                                       "async_load_min_tokens"};

class Telemetry {
 public:
  void add(Counter c, std::int64_t v) { counts_[static_cast<std::size_t>(c)] += v; }
  std::int64_t get(Counter c) const { return counts_[static_cast<std::size_t>(c)]; }
  // The gauge's value now.
  void set(Gauge g, double v) { gauges_[static_cast<std::size_t>(g)] = v; }
  // Live: the value set last. Taken: the value this take reports, or nullopt
  // when it reports none (unchanged since the previous take).
  std::optional<double> gauge(Gauge g) const { return gauges_[static_cast<std::size_t>(g)]; }
  // Which take this is (1 for the first); 0 while live.
  std::uint64_t seq() const { return seq_; }
  // No counter moved and no gauge to report.
  bool empty() const {
    for (auto v : counts_) {
      if (v != 0) return false;
    }
    for (std::size_t i = 0; i < gauges_.size(); ++i) {
      if (gauges_[i] && gauges_[i] != reported_[i]) return false;
    }
    return true;
  }
  // The counts since the last take, and the gauges whose value changed since
  // the last take reported them (each gauge's first value counts as a change).
  Telemetry take() {
    Telemetry out;
    out.counts_ = counts_;
    for (std::size_t i = 0; i < gauges_.size(); ++i) {
      if (gauges_[i] && gauges_[i] != reported_[i]) out.gauges_[i] = gauges_[i];
    }
    reported_ = gauges_;
    counts_.fill(0);
    out.seq_ = ++takes_;
    return out;
  }

 private:
  std::array<std::int64_t, static_cast<std::size_t>(Counter::kCount)> counts_{};
  std::array<std::optional<double>, static_cast<std::size_t>(Gauge::kCount)> gauges_{};
  std::array<std::optional<double>, static_cast<std::size_t>(Gauge::kCount)> reported_{};
  std::uint64_t takes_ = 0;
  std::uint64_t seq_ = 0;
};

}  // namespace activekv
