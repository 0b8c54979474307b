// What the engine reads of vLLM's config and KV cache groups at start-up, in
// the reference's order, with the reference's refusals as ValueError.
#pragma once

#include <pybind11/pybind11.h>

#include "activekv/config.h"
#include "activekv/kv_layout.h"
#include "activekv/streaming_geometry.h"

namespace activekv::bindings {

namespace py = pybind11;

// The KV cache's layout: its one full-attention group's layers, block shape
// and dtype.
KVLayout layout_of(const py::handle& kv_cache_config);

// The geometry for a streaming config, after vLLM's settings were checked;
// ValueError with the reference's message otherwise. The layer names are the
// one group's, read only once the check passed (as the reference does).
StreamingGeometry streaming_geometry(const StreamingConfig& streaming, const py::handle& vllm_config,
                                     const py::handle& kv_cache_groups);

}  // namespace activekv::bindings
