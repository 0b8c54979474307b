// Layer streaming's geometry and start-up refusals: which layers are resident,
// which take turns in the ring, what vLLM settings streaming cannot serve, and
// the start-up report. Plain data and arithmetic, no torch: the ring and its
// copies are layer_streaming.h. Mirrors the reference
// (reference/activekv_reference/streaming.py).
//
// Geometry. The first R layers of the KV cache group (in vLLM's order) are
// resident: their KV stays on the device. The other L - R layers are streamed:
// the host holds every block of theirs (the block's home, a row the scheduler
// gives it, home_rows.h; exact bytes or the compressed codec's, as `homes`
// says) and the device holds a ring of K buffers, each
// one layer's worth of blocks. Streamed layer j (0-based among the streamed)
// uses buffer j % K: vLLM views its KV cache onto that buffer
// (get_kv_cache_regions, patches/vllm/0.32.0/0002), so its block table, its
// attention kernel and its KV cache update work unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "activekv/config.h"
#include "activekv/kv_cache_groups.h"
#include "activekv/status.h"

namespace activekv {

// Which layers are resident, which are streamed, and which ring buffer each
// streamed layer uses. Plain data.
struct StreamingGeometry {
  std::vector<std::string> layer_names;  // the KV cache group's, in vLLM's order
  std::int64_t resident_layers = 0;
  std::int64_t ring_size = 2;
  Mode homes = Mode::kExact;  // how the host holds the streamed layers

  // The geometry for these layers; kInvalidConfig (naming the key, the
  // reference's text) when streaming cannot save device memory with them.
  static Result<StreamingGeometry> plan(const StreamingConfig& config,
                                        const std::vector<std::string>& layer_names);

  std::vector<std::string> resident() const;
  std::vector<std::string> streamed() const;
  std::int64_t num_streamed() const {
    return static_cast<std::int64_t>(layer_names.size()) - resident_layers;
  }
  // The layers sharing each region of the device KV cache: one per resident
  // layer, then one per ring buffer.
  std::vector<std::vector<std::string>> regions() const;
  // The position of a streamed layer among the streamed, or -1 (resident or
  // unknown).
  std::int64_t streamed_index(const std::string& name) const;
  // The ring buffer of a streamed layer. Must be called with a streamed layer.
  std::int64_t ring_of(const std::string& name) const;
};

// What check_streamable looks at, read from vLLM's config once at start-up.
struct StreamableFacts {
  bool use_mla = false;
  KVCacheGroups groups;
  bool sliding_window = false;        // the one group's spec has a sliding window
  std::int64_t attention_layers = 0;  // the model's attention layers
  std::int64_t kv_cache_layers = 0;   // the group's layers (those with a KV cache)
  bool speculative = false;
  std::int64_t pipeline_parallel_size = 1;
};

// Refuses, naming the setting, a model or vLLM setting streaming cannot serve
// (kInvalidConfig, the reference's text and order).
Status check_streamable(const StreamableFacts& facts);

// The start-up numbers of streaming, and the line the scheduler logs once.
struct StartupReport {
  std::int64_t resident_layers = 0;
  std::int64_t streamed_layers = 0;
  std::int64_t ring_size = 0;
  std::int64_t device_blocks = 0;          // what vLLM holds with streaming
  std::int64_t device_blocks_without = 0;  // the same memory without streaming
  std::int64_t block_size = 0;
  std::int64_t host_bytes = 0;         // the streamed layers' homes, per worker
  std::int64_t decode_step_bytes = 0;  // host->device bytes of a max_model_len decode step
  Mode homes = Mode::kExact;

  // `layer_bytes`: one block of one layer as its home holds it.
  static StartupReport of(const StreamingGeometry& geometry, std::int64_t num_blocks, std::int64_t block_size,
                          std::int64_t layer_bytes, std::int64_t max_model_len);
  std::string line() const;
  // The homes come on top of the host store, in every worker: refuses
  // (naming what to lower) a store plus homes beyond the host's memory.
  Status check_host_memory(std::int64_t capacity_bytes, const HostMemory& host) const;
};

}  // namespace activekv
