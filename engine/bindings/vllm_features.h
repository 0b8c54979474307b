// What the running vLLM offers the connector, asked once when the vLLM-facing
// classes are built: one native module serves every supported vLLM version
// (0.26.0 and 0.34.0 on CUDA, 0.32.0 on CPU) by probing instead of importing what one
// version lacks. activekv.vllm_features() returns these answers, so tests and
// operators can print them.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

namespace activekv {

struct VllmFeatures {
  std::string version;
  // vllm.v1.metrics.cache_hit_source (0.32.0; absent in 0.26.0): the class
  // attribute that labels the prefix-cache hits a connector serves.
  bool cache_hit_source = false;
  // KVConnectorBase_V1.has_layer_work: patch 0001 of ActiveKV's series.
  bool layer_work_hook = false;
  // KVConnectorBase_V1.get_kv_cache_regions and loads_before_kv_cache_update:
  // patch 0002 (layer streaming).
  bool streaming_hooks = false;
  // KVConnectorBase_V1.requires_piecewise_for_cudagraph: vLLM asks it before
  // capturing full CUDA graphs, which would skip the per-layer hooks.
  bool piecewise_hook = false;
  // KVConnectorBase_V1.get_required_kvcache_layout.
  bool kvcache_layout_hook = false;
  // SchedulerOutput.has_sync_kv_loads (0.32.0+): the model runner calls
  // start_load_kv before the forward only on steps marked so, else after it.
  bool sync_kv_loads_flag = false;
  // CacheConfig.enable_extensible_kv_cache (0.34.0, on by default on CUDA):
  // the KV cache committed after warm-up, from memory vLLM measured.
  bool extensible_kv_cache = false;
  // KVConnectorBase_V1.supports_sleep_mode (0.33.0): asked when sleep mode is on.
  bool sleep_mode_hook = false;
  // KVConnectorBase_V1.get_external_cache_hit_sources (0.32.0): prefix hits
  // counted by tier (ActiveKV's are host hits).
  bool hit_sources_hook = false;

  // Whether a vLLM dataclass declares a field (read from its declaration: a
  // field without a default is no class attribute).
  static bool has_field(const char* module, const char* cls, const char* field) {
    namespace py = pybind11;
    const py::object fields =
        py::getattr(py::module_::import(module).attr(cls), "__dataclass_fields__", py::none());
    return !fields.is_none() && fields.contains(field);
  }

  static VllmFeatures probe(const pybind11::object& base) {
    namespace py = pybind11;
    VllmFeatures f;
    f.version = py::cast<std::string>(py::module_::import("vllm").attr("__version__"));
    const py::object find_spec = py::module_::import("importlib.util").attr("find_spec");
    f.cache_hit_source = !find_spec("vllm.v1.metrics.cache_hit_source").is_none();
    f.layer_work_hook = py::hasattr(base, "has_layer_work");
    f.streaming_hooks =
        py::hasattr(base, "get_kv_cache_regions") && py::hasattr(base, "loads_before_kv_cache_update");
    f.piecewise_hook = py::hasattr(base, "requires_piecewise_for_cudagraph");
    f.kvcache_layout_hook = py::hasattr(base, "get_required_kvcache_layout");
    f.sync_kv_loads_flag = has_field("vllm.v1.core.sched.output", "SchedulerOutput", "has_sync_kv_loads");
    f.extensible_kv_cache = has_field("vllm.config", "CacheConfig", "enable_extensible_kv_cache");
    f.sleep_mode_hook = py::hasattr(base, "supports_sleep_mode");
    f.hit_sources_hook = py::hasattr(base, "get_external_cache_hit_sources");
    return f;
  }

  pybind11::dict as_dict() const {
    namespace py = pybind11;
    py::dict d;
    d["version"] = version;
    d["cache_hit_source"] = cache_hit_source;
    d["layer_work_hook"] = layer_work_hook;
    d["streaming_hooks"] = streaming_hooks;
    d["piecewise_hook"] = piecewise_hook;
    d["kvcache_layout_hook"] = kvcache_layout_hook;
    d["sync_kv_loads_flag"] = sync_kv_loads_flag;
    d["extensible_kv_cache"] = extensible_kv_cache;
    d["sleep_mode_hook"] = sleep_mode_hook;
    d["hit_sources_hook"] = hit_sources_hook;
    return d;
  }
};

}  // namespace activekv
