// Telemetry as vLLM takes it: ActiveKVStats (KVConnectorStats, aggregated over
// workers and steps) and ActiveKVPromMetrics (one Prometheus counter per
// engine counter).
#pragma once

#include <pybind11/pybind11.h>

#include "activekv/telemetry.h"

namespace activekv::bindings {

namespace py = pybind11;

// An ActiveKVStats of these counters, or None when none moved.
py::object stats_or_none(const Telemetry& t);

// The methods of ActiveKVStats and ActiveKVPromMetrics (make_vllm_classes).
py::dict stats_namespace();
py::dict prom_namespace(const py::object& prom_base);

}  // namespace activekv::bindings
