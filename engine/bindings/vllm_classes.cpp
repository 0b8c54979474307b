#include "vllm_classes.h"

#include <string>

#include "connector.h"
#include "convert.h"
#include "metrics.h"

namespace activekv::bindings {

Classes* g_classes = nullptr;

namespace {

py::object make_class(const py::object& base, const char* name, py::dict ns) {
  ns["__module__"] = kModule;
  ns["__qualname__"] = name;
  return py::type::handle_of(base)(name, py::make_tuple(base), ns);
}

py::dict worker_meta_namespace() {
  py::dict ns;
  ns["aggregate"] = named("aggregate", [](py::object self, py::object other) {
    if (!py::isinstance(other, g_classes->worker_meta)) {
      throw py::type_error("cannot aggregate " +
                           py::cast<std::string>(py::type::handle_of(other).attr("__name__")) +
                           " into ActiveKV metadata");
    }
    WorkerReport merged = report_from_python(self);
    merged.merge(report_from_python(other));
    return report_to_python(merged);
  });
  return ns;
}

}  // namespace

void make_vllm_classes(py::module_ m) {
  if (g_classes != nullptr) return;
  const py::module_ base = py::module_::import("vllm.distributed.kv_transfer.kv_connector.v1.base");
  const py::module_ metrics = py::module_::import("vllm.distributed.kv_transfer.kv_connector.v1.metrics");
  g_classes = new Classes{};  // after the imports: a missing vLLM leaves nothing half-made
  g_classes->base = base.attr("KVConnectorBase_V1");
  g_classes->scheduler_role = base.attr("KVConnectorRole").attr("SCHEDULER");
  g_classes->features = VllmFeatures::probe(g_classes->base);
  g_classes->metadata = make_class(base.attr("KVConnectorMetadata"), "ActiveKVMetadata", py::dict());
  g_classes->empty_metadata = new_metadata(StepPlan{});
  g_classes->worker_meta =
      make_class(base.attr("KVConnectorWorkerMetadata"), "ActiveKVWorkerMetadata", worker_meta_namespace());
  g_classes->stats = make_class(metrics.attr("KVConnectorStats"), "ActiveKVStats", stats_namespace());
  const py::object prom_base = metrics.attr("KVConnectorPromMetrics");
  g_classes->prom = make_class(prom_base, "ActiveKVPromMetrics", prom_namespace(prom_base));
  const py::object connector = make_class(g_classes->base, kConnectorName, connector_namespace());

  m.attr("ActiveKVMetadata") = g_classes->metadata;
  m.attr("ActiveKVWorkerMetadata") = g_classes->worker_meta;
  m.attr("ActiveKVStats") = g_classes->stats;
  m.attr("ActiveKVPromMetrics") = g_classes->prom;
  m.attr(kConnectorName) = connector;
  m.attr(kConnectorAlias) = connector;
}

}  // namespace activekv::bindings
