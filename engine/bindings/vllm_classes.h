// The Python classes vLLM sees, subclasses of vLLM's own bases made on first
// use (make_vllm_classes), and the helpers that give them native methods.
#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <utility>

#include "vllm_features.h"

namespace activekv::bindings {

namespace py = pybind11;

inline constexpr const char* kModule = "activekv";
// The connector's name in kv_connector. vLLM has a class of its own named
// ActiveKVConnector since 0.26 (its model runner's wrapper of "the active
// connector"), so logs and tracebacks name ours apart from it; the old name
// stays an alias of the same class for configs written before.
inline constexpr const char* kConnectorName = "ActiveKVHostConnector";
inline constexpr const char* kConnectorAlias = "ActiveKVConnector";
// The module's attributes made by make_vllm_classes.
inline constexpr std::array<const char*, 6> kVllmFacing = {kConnectorName,     kConnectorAlias,
                                                           "ActiveKVMetadata", "ActiveKVWorkerMetadata",
                                                           "ActiveKVStats",    "ActiveKVPromMetrics"};

struct Classes {
  py::object base;            // KVConnectorBase_V1
  py::object scheduler_role;  // KVConnectorRole.SCHEDULER: tells the two sides apart at construction
  py::object metadata;        // ActiveKVMetadata
  py::object empty_metadata;  // one shared instance for the steps that move nothing
  py::object worker_meta;     // ActiveKVWorkerMetadata
  py::object stats;           // ActiveKVStats
  py::object prom;            // ActiveKVPromMetrics
  VllmFeatures features;      // what the running vLLM offers (vllm_features.h)
};
// Null until make_vllm_classes; lives as long as the module (never freed:
// the interpreter owns it).
extern Classes* g_classes;

// Builds the classes vLLM sees and puts them on the module. Must be called
// with the GIL held; runs once.
void make_vllm_classes(py::module_ m);

inline py::object new_instance(const py::object& cls) { return cls.attr("__new__")(cls); }

// A method for a class built with type(): `self` comes first.
template <class F, class... Extra>
py::cpp_function method(F&& f, const Extra&... extra) {
  return py::cpp_function(std::forward<F>(f), py::is_method(py::none()), extra...);
}

// A named method: tracebacks and profiles show which one ran.
template <class F, class... Extra>
py::cpp_function named(const char* name, F&& f, const Extra&... extra) {
  return method(std::forward<F>(f), py::name(name), extra...);
}

}  // namespace activekv::bindings
