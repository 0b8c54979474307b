// Telemetry as vLLM takes it: ActiveKVStats (KVConnectorStats, aggregated over
// workers and steps) and ActiveKVPromMetrics (a Prometheus counter per engine
// counter, a gauge per engine gauge, and the configuration as an info
// metric). docs/metrics.md is the operator's account of them.
//
// The stats' data: each counter by name (summed by aggregate), and under
// "gauges" each reported gauge as {source: [seq, value]}, a source being
// "scheduler" or "worker<rank>" and seq its take's number. aggregate keeps
// each source's latest value (the highest seq): steps of one source replace,
// sources add up. The Prometheus gauge is the sum over the sources of each
// one's latest value, remembered per engine across steps (a source reports a
// gauge only when it changed).
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "activekv/telemetry.h"

namespace activekv::bindings {

namespace py = pybind11;

// An ActiveKVStats of these counters and gauges, reported by `source`, or
// None when nothing moved.
py::object stats_or_none(const Telemetry& t, const std::string& source);

// The methods of ActiveKVStats and ActiveKVPromMetrics (make_vllm_classes).
py::dict stats_namespace();
py::dict prom_namespace(const py::object& prom_base);

// The names the engine exports, with their help: {"counters": {name: help},
// "gauges": {name: help}, "info": {"name", "help", "labels"}}.
py::dict telemetry_names();

}  // namespace activekv::bindings
