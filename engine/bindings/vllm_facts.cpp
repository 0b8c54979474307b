#include "vllm_facts.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "activekv/kv_cache_groups.h"
#include "convert.h"
#include "errors.h"

namespace activekv::bindings {
namespace {

// The groups as ActiveKV's rule about them reads them (kv_cache_groups.h), for
// the host store's layout and for streaming alike.
KVCacheGroups kv_cache_groups_of(const py::list& groups) {
  const py::object full = py::module_::import("vllm.v1.kv_cache_interface").attr("FullAttentionSpec");
  KVCacheGroups out;
  for (const auto& g : groups) {
    out.kinds.push_back(py::cast<std::string>(py::type::handle_of(g.attr("kv_cache_spec")).attr("__name__")));
  }
  out.one_full_attention =
      groups.size() == 1 && py::type::handle_of(groups[0].attr("kv_cache_spec")).is(full);
  return out;
}

// What check_streamable needs of vLLM's config, read once at start-up, in the
// reference's order and no further than its first refusal (so a config
// lacking a later field fails in both engines alike).
StreamableFacts streamable_facts(const py::handle& vllm_config, const py::handle& kv_cache_groups) {
  StreamableFacts f;
  const py::object model = vllm_config.attr("model_config");
  f.use_mla = py::cast<bool>(py::bool_(py::getattr(model, "use_mla", py::bool_(false))));
  if (f.use_mla) return f;
  const py::list groups(py::reinterpret_borrow<py::object>(kv_cache_groups));
  f.groups = kv_cache_groups_of(groups);
  if (!f.groups.one_full_attention) return f;
  f.sliding_window = !py::getattr(groups[0].attr("kv_cache_spec"), "sliding_window", py::none()).is_none();
  if (f.sliding_window) return f;
  const py::object parallel = vllm_config.attr("parallel_config");
  f.attention_layers =
      py::cast<std::int64_t>(model.attr("get_num_layers_by_block_type")(parallel, "attention"));
  f.kv_cache_layers = static_cast<std::int64_t>(py::len(groups[0].attr("layer_names")));
  if (f.attention_layers != f.kv_cache_layers) return f;
  f.speculative = !vllm_config.attr("speculative_config").is_none();
  if (f.speculative) return f;
  f.pipeline_parallel_size = py::cast<std::int64_t>(parallel.attr("pipeline_parallel_size"));
  return f;
}

}  // namespace

StreamingGeometry streaming_geometry(const StreamingConfig& streaming, const py::handle& vllm_config,
                                     const py::handle& kv_cache_groups) {
  raise_if_failed(check_streamable(streamable_facts(vllm_config, kv_cache_groups)));
  const auto layer_names = py::cast<std::vector<std::string>>(
      py::list(py::reinterpret_borrow<py::object>(kv_cache_groups))[0].attr("layer_names"));
  return value_or_raise(StreamingGeometry::plan(streaming, layer_names));
}

KVLayout layout_of(const py::handle& kv_cache_config) {
  const py::list groups = kv_cache_config.attr("kv_cache_groups");
  if (const auto why = unservable_kv_cache_groups(kv_cache_groups_of(groups))) {
    raise_layout_error("ActiveKV cannot serve " + *why);
  }
  const py::object spec = groups[0].attr("kv_cache_spec");
  if (!spec.attr("head_size_v").equal(spec.attr("head_size"))) {
    raise_layout_error("ActiveKV needs K and V heads of the same size");
  }
  KVLayout layout;
  layout.layer_names = py::cast<std::vector<std::string>>(groups[0].attr("layer_names"));
  layout.block_size = py::cast<std::int64_t>(spec.attr("block_size"));
  layout.num_kv_heads = py::cast<std::int64_t>(spec.attr("num_kv_heads"));
  layout.head_size = py::cast<std::int64_t>(spec.attr("head_size"));
  layout.dtype = dtype_from_python(spec.attr("dtype"));
  return layout;
}

}  // namespace activekv::bindings
