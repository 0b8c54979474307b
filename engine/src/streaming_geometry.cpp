// Layer streaming's geometry, the settings it refuses, and its start-up report
// (streaming_geometry.h): plain arithmetic, no torch.
#include "activekv/streaming_geometry.h"

#include "activekv/home_rows.h"

#include <algorithm>
#include <stdexcept>

namespace activekv {
namespace {

constexpr const char* kStreamingKey = "kv_connector_extra_config['streaming']";

std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

Status bad(std::string message) { return {ErrorCode::kInvalidConfig, std::move(message)}; }

}  // namespace

Result<StreamingGeometry> StreamingGeometry::plan(const StreamingConfig& config,
                                                  const std::vector<std::string>& layer_names) {
  const auto n = static_cast<std::int64_t>(layer_names.size());
  const std::int64_t r = config.resident_layers;
  const std::int64_t k = config.ring_size;
  if (r >= n) {
    return bad(std::string(kStreamingKey) + "['resident_layers']: " + std::to_string(r) +
               " leaves no layer to stream; this model has " + std::to_string(n) +
               " KV cache layers, so it accepts 0.." + std::to_string(n - 1));
  }
  if (r + k >= n) {
    return bad(std::string(kStreamingKey) + ": resident_layers + ring_size = " + std::to_string(r) + " + " +
               std::to_string(k) + " must be below the model's " + std::to_string(n) +
               " KV cache layers, or streaming holds no more blocks than the device does without "
               "it; lower resident_layers or ring_size");
  }
  return StreamingGeometry{layer_names, r, k, config.homes};
}

std::vector<std::string> StreamingGeometry::resident() const {
  return {layer_names.begin(), layer_names.begin() + resident_layers};
}

std::vector<std::string> StreamingGeometry::streamed() const {
  return {layer_names.begin() + resident_layers, layer_names.end()};
}

std::vector<std::vector<std::string>> StreamingGeometry::regions() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& name : resident()) out.push_back({name});
  const auto streamed_layers = streamed();
  for (std::int64_t ring = 0; ring < ring_size; ++ring) {
    std::vector<std::string> region;
    for (auto j = static_cast<std::size_t>(ring); j < streamed_layers.size();
         j += static_cast<std::size_t>(ring_size)) {
      region.push_back(streamed_layers[j]);
    }
    out.push_back(std::move(region));
  }
  return out;
}

std::int64_t StreamingGeometry::streamed_index(const std::string& name) const {
  const auto it = std::find(layer_names.begin() + resident_layers, layer_names.end(), name);
  if (it == layer_names.end()) return -1;
  return (it - layer_names.begin()) - resident_layers;
}

std::int64_t StreamingGeometry::ring_of(const std::string& name) const {
  const std::int64_t j = streamed_index(name);
  if (j < 0) throw std::invalid_argument("layer '" + name + "' is not streamed");
  return j % ring_size;
}

Status check_streamable(const StreamableFacts& facts) {
  const auto refuse = [](const std::string& why) {
    return bad(std::string(kStreamingKey) + ": layer streaming cannot serve " + why);
  };
  if (facts.use_mla) {
    return refuse("a model with multi-head latent attention (MLA); turn streaming off for it");
  }
  if (const auto why = unservable_kv_cache_groups(facts.groups)) return refuse(*why);
  if (facts.sliding_window) {
    return refuse("sliding-window attention; it needs full attention in every layer");
  }
  if (facts.kv_cache_layers != facts.attention_layers) {
    return refuse("a model whose layers share KV (" + std::to_string(facts.attention_layers) +
                  " attention layers, " + std::to_string(facts.kv_cache_layers) +
                  " with a KV cache of their own)");
  }
  if (facts.speculative) {
    return refuse("speculative decoding (speculative_config is set); turn one of them off");
  }
  if (facts.pipeline_parallel_size > 1) {
    return refuse("pipeline parallelism (pipeline_parallel_size " +
                  std::to_string(facts.pipeline_parallel_size) + "); use tensor parallelism");
  }
  return Status::Ok();
}

StartupReport StartupReport::of(const StreamingGeometry& geometry, std::int64_t num_blocks,
                                std::int64_t block_size, std::int64_t layer_bytes,
                                std::int64_t max_model_len) {
  const std::int64_t regions = geometry.resident_layers + geometry.ring_size;
  const std::int64_t streamed = geometry.num_streamed();
  StartupReport r;
  r.resident_layers = geometry.resident_layers;
  r.streamed_layers = streamed;
  r.ring_size = geometry.ring_size;
  r.device_blocks = num_blocks;
  r.device_blocks_without = num_blocks * regions / static_cast<std::int64_t>(geometry.layer_names.size());
  r.block_size = block_size;
  r.host_bytes = home_rows_for(num_blocks) * streamed * layer_bytes;
  r.decode_step_bytes = cdiv(max_model_len, block_size) * streamed * layer_bytes;
  r.homes = geometry.homes;
  return r;
}

std::string StartupReport::line() const {
  const std::int64_t tokens = device_blocks * block_size;
  const std::int64_t without = device_blocks_without * block_size;
  return "ActiveKV layer streaming: " + std::to_string(resident_layers) + " resident + " +
         std::to_string(streamed_layers) + " streamed layers, ring of " + std::to_string(ring_size) +
         "; the device holds " + std::to_string(device_blocks) + " blocks (" + std::to_string(tokens) +
         " tokens), " + std::to_string(without / block_size) + " blocks (" + std::to_string(without) +
         " tokens) without streaming; host memory reserved for the streamed layers " +
         std::to_string(host_bytes) + " bytes per worker; a full-context decode step moves " +
         std::to_string(decode_step_bytes) + " bytes host->device per worker" +
         (homes == Mode::kCompressed
              ? "; the homes are compressed (int8 + scales, lossy within the codec's bound)"
              : "");
}

Status StartupReport::check_host_memory(std::int64_t capacity_bytes, const HostMemory& host) const {
  if (capacity_bytes + host_bytes <= host.bytes) return Status::Ok();
  return bad("kv_connector_extra_config['capacity_bytes']=" + std::to_string(capacity_bytes) +
             " plus the streamed layers' homes (" + std::to_string(host_bytes) + " bytes for " +
             std::to_string(device_blocks) + " blocks) exceed " + host.what + " (" +
             std::to_string(host.bytes) +
             " bytes); lower capacity_bytes, raise "
             "kv_connector_extra_config['streaming']['resident_layers'], or give vLLM fewer KV "
             "cache blocks (gpu_memory_utilization, num_gpu_blocks_override)");
}

}  // namespace activekv
