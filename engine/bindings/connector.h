// ActiveKVHostConnector's methods: vLLM's factory reads the connector's constructor
// signature and checks isinstance(..., KVConnectorBase_V1), so the connector is
// a real subclass made with the base's own metaclass (make_vllm_classes) and
// these are native functions. Each method takes what it needs from the Python
// arguments under the GIL, then releases the GIL for the native work. Nothing
// here calls back into Python objects of ours on a per-step path: per step,
// only vLLM's arguments are read.
#pragma once

#include <pybind11/pybind11.h>

namespace activekv::bindings {

namespace py = pybind11;

// The class namespace of ActiveKVHostConnector; needs g_classes' bases and features.
py::dict connector_namespace();

}  // namespace activekv::bindings
