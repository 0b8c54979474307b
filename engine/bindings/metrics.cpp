#include "metrics.h"

#include <cstddef>
#include <string>

#include "vllm_classes.h"

namespace activekv::bindings {

using namespace pybind11::literals;

namespace {

py::dict telemetry_dict(const Telemetry& t) {
  py::dict d;
  for (std::size_t i = 0; i < kCounterNames.size(); ++i) {
    d[py::str(std::string(kCounterNames[i]))] = t.get(static_cast<Counter>(i));
  }
  return d;
}

}  // namespace

py::object stats_or_none(const Telemetry& t) {
  if (t.empty()) return py::none();
  return g_classes->stats("data"_a = telemetry_dict(t));
}

py::dict stats_namespace() {
  py::dict ns;
  ns["reset"] = named("reset", [](py::object self) {
    py::dict data = self.attr("data");
    for (const auto& n : kCounterNames) data[py::str(std::string(n))] = 0;
  });
  ns["aggregate"] = named("aggregate", [](py::object self, py::object other) {
    py::dict data = self.attr("data");
    py::dict theirs = other.attr("data");
    for (const auto& n : kCounterNames) {
      const py::str k{std::string(n)};
      data[k] = data.attr("get")(k, 0) + theirs.attr("get")(k, 0);
    }
    return self;
  });
  ns["reduce"] = named("reduce", [](py::object self) {
    py::dict data = self.attr("data");
    py::dict out;
    for (const auto& n : kCounterNames) out[py::str(std::string(n))] = data.attr("get")(std::string(n), 0);
    return out;
  });
  ns["is_empty"] = named("is_empty", [](py::object self) {
    py::dict data = self.attr("data");
    for (const auto& n : kCounterNames) {
      if (py::cast<bool>(data.attr("get")(std::string(n), 0))) return false;
    }
    return true;
  });
  return ns;
}

py::dict prom_namespace(const py::object& prom_base) {
  py::dict ns;
  ns["__init__"] = method([prom_base](py::object self, py::object vllm_config, py::object types,
                                      py::object labels, py::dict per_engine) {
    prom_base.attr("__init__")(self, vllm_config, types, labels, per_engine);
    py::dict counters;
    for (const auto& n : kCounterNames) {
      const std::string name(n);
      py::object c = self.attr("_counter_cls")("name"_a = "vllm:activekv_" + name,
                                               "documentation"_a = "ActiveKV " + name,
                                               "labelnames"_a = labels);
      py::dict per;
      for (const auto& [idx, values] : per_engine) per[idx] = c.attr("labels")(*values);
      counters[py::str(name)] = per;
    }
    self.attr("_activekv_counters") = counters;
  });
  ns["observe"] = named("observe", [](py::object self, py::dict data, py::int_ engine_idx) {
    py::dict counters = self.attr("_activekv_counters");
    for (const auto& [name, per] : counters) {
      const py::object v = data.attr("get")(name, 0);
      if (py::cast<bool>(v)) per[engine_idx].attr("inc")(v);
    }
  }, "transfer_stats_data"_a, "engine_idx"_a = 0);
  return ns;
}

}  // namespace activekv::bindings
