// The pybind11 module `activekv`: its functions, and read-only views of the two
// sides for the parity harness and tests. The rest of this folder:
//   connector.h          ActiveKVHostConnector's methods
//   scheduler_adapter.h  the scheduler side as a connector holds it
//   vllm_classes.h       the classes vLLM sees, made on first use
//   metrics.h            ActiveKVStats and ActiveKVPromMetrics
//   convert.h            values between Python and the engine (config, keys, metadata)
//   vllm_facts.h         what the engine reads of vLLM's config at start-up
//   vllm_features.h      what the running vLLM offers
//   attributes.h         attribute names read every step
//   check_device.h       activekv.check_device
//   errors.h             activekv.ConfigError, UnsupportedLayoutError; a Status raised
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "activekv/worker_side.h"
#include "check_device.h"
#include "errors.h"
#include "metrics.h"
#include "scheduler_adapter.h"
#include "vllm_classes.h"

namespace py = pybind11;

PYBIND11_MODULE(activekv, m) {
  using namespace activekv;
  using namespace activekv::bindings;
  m.doc() = "ActiveKV: vLLM's KV cache in host RAM. Load with kv_connector_module_path='activekv'.";
  register_errors(m);
  py::class_<SchedulerEngine>(m, "_SchedulerEngine");
  // Read-only views of the host store, for the parity harness and tests.
  py::class_<WorkerSide>(m, "_WorkerEngine")
      .def("sealed_slots",
           [](WorkerSide& w) {
             return w.arena() != nullptr ? w.arena()->sealed_slots() : std::vector<std::int64_t>{};
           })
      .def("slot_data",
           [](WorkerSide& w, std::int64_t slot) {
             if (w.arena() == nullptr) throw py::value_error("KV caches not registered yet");
             auto data = w.arena()->slot_data(slot);
             if (!data.ok()) throw py::index_error(data.status().error());
             return py::bytes(data.value());
           })
      .def("streamed_layers",
           [](WorkerSide& w) {
             return w.streamer() != nullptr ? w.streamer()->geometry().streamed()
                                            : std::vector<std::string>{};
           })
      .def("streamed_home", [](WorkerSide& w, const std::string& name) {
        if (w.streamer() == nullptr)
          throw py::value_error("no streamed layers (streaming off or not registered)");
        return py::bytes(w.streamer()->home_bytes(name));
      });

  // The vLLM-facing classes are made on first use, not at import: importing the
  // engine needs only torch (the payload audit loads it where vLLM is absent),
  // and vLLM reaches them by name (kv_connector_module_path, unpickling).
  m.def("__getattr__", [m](const std::string& name) -> py::object {
    if (std::find(kVllmFacing.begin(), kVllmFacing.end(), name) == kVllmFacing.end()) {
      throw py::attribute_error("module 'activekv' has no attribute '" + name + "'");
    }
    make_vllm_classes(m);
    return m.attr(name.c_str());
  });
  m.def(
      "vllm_features",
      [m] {
        make_vllm_classes(m);
        return g_classes->features.as_dict();
      },
      "What the installed vLLM offers ActiveKV (its version, the patch series' hooks, the optional\n"
      "interfaces ActiveKV uses where present), as probed when the connector class was built.");
  m.def(
      "register",
      [] {
        const py::object factory = py::module_::import("vllm.distributed.kv_transfer.kv_connector.factory")
                                       .attr("KVConnectorFactory");
        for (const char* name : {kConnectorName, kConnectorAlias}) {
          factory.attr("register_connector")(name, kModule, kConnectorName);
        }
      },
      "vllm.general_plugins entry point: makes 'ActiveKVHostConnector' (and its older name\n"
      "'ActiveKVConnector') known to vLLM by name.");

  m.def(
      "telemetry_names", [] { return telemetry_names(); },
      "The telemetry the engine exports (docs/metrics.md): {'counters': {name: help}, 'gauges':\n"
      "{name: help}, 'info': {'name', 'help', 'labels'}}; Prometheus shows each as vllm:activekv_<name>\n"
      "(a counter with _total).");

  // ---- the device check: the engine's device scenarios, for operators and the
  // release's GPU check of the shipped wheel (device_check.h) ----
  m.def(
      "check_device",
      [](const py::object& device, bool quiet) { return check_device_from_python(device, quiet); },
      py::arg("device") = py::none(), py::kw_only(), py::arg("quiet") = false,
      "Run the engine's device scenarios on `device` (a str or torch.device; default: torch's current\n"
      "accelerator, else the CPU): a worker over real KV caches there saving and loading blocks, its\n"
      "save fences completing, a fence past its deadline quarantining its slots, and layer\n"
      "streaming's ring. Prints a line per scenario unless quiet; returns the results as dicts\n"
      "(name, outcome: passed/failed/skipped, detail, seconds); raises RuntimeError naming each\n"
      "failed scenario. Needs ~1.5 GiB of device and pinned host memory on an accelerator.");
}
