// Values between Python and the engine: block keys, the extra config, dtypes,
// and the metadata passed from the scheduler to the workers and back.
#pragma once

#include <c10/core/ScalarType.h>
#include <pybind11/pybind11.h>

#include <map>
#include <string>

#include "activekv/block_key.h"
#include "activekv/config.h"
#include "activekv/step_plan.h"

namespace activekv::bindings {

namespace py = pybind11;

py::bytes to_bytes(const BlockKey& key);
// ValueError unless `b` is 32 bytes.
BlockKey to_key(const py::handle& b);

std::map<std::string, ConfigValue> to_config_values(const py::handle& extra);
// kv_connector_extra_config, checked; ValueError with the config's message.
Config parse_config(const py::handle& extra);

// torch.bfloat16, torch.float16 or torch.float32; ValueError for another.
c10::ScalarType dtype_from_python(const py::handle& dtype);
// The name the model identity digests ("bfloat16", ...).
std::string dtype_name(c10::ScalarType t);

// A new ActiveKVMetadata (scheduler -> workers) holding `plan`.
py::object new_metadata(const StepPlan& plan);
// The step's ActiveKVMetadata: the shared empty instance for a plan that
// moves nothing.
py::object plan_to_python(const StepPlan& plan);
// TypeError for metadata of another class.
StepPlan plan_from_python(const py::handle& meta);
// ActiveKVWorkerMetadata (workers -> scheduler).
py::object report_to_python(const WorkerReport& r);
WorkerReport report_from_python(const py::handle& meta);

}  // namespace activekv::bindings
