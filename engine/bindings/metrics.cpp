#include "metrics.h"

#include <cstddef>
#include <string>

#include "activekv/config.h"
#include "convert.h"
#include "vllm_classes.h"

namespace activekv::bindings {

using namespace pybind11::literals;

namespace {

constexpr const char* kPrefix = "vllm:activekv_";
constexpr const char* kGaugesKey = "gauges";

py::str name_of(std::string_view n) { return py::str(n.data(), n.size()); }

py::dict telemetry_dict(const Telemetry& t, const std::string& source) {
  py::dict d;
  for (std::size_t i = 0; i < kCounterNames.size(); ++i) {
    d[name_of(kCounterNames[i])] = t.get(static_cast<Counter>(i));
  }
  py::dict gauges;
  for (std::size_t i = 0; i < kGaugeNames.size(); ++i) {
    const auto g = static_cast<Gauge>(i);
    const auto v = t.gauge(g);
    if (!v) continue;
    const py::object value =
        gauge_is_ratio(g) ? py::object(py::float_(*v)) : py::object(py::int_(static_cast<long long>(*v)));
    py::dict per;
    per[py::str(source)] = py::list(py::make_tuple(t.seq(), value));
    gauges[name_of(kGaugeNames[i])] = per;
  }
  d[kGaugesKey] = gauges;
  return d;
}

py::dict gauges_of(const py::handle& data) {
  const py::object g = data.attr("get")(kGaugesKey);
  return g.is_none() ? py::dict() : py::dict(g);
}

// `into`'s entries of each source, replaced by `from`'s where as recent
// (seq) or newer; new dicts, so the stats merged from are left as they were.
py::dict merge_latest(const py::dict& into, const py::dict& from) {
  py::dict out;
  for (const auto& [name, per] : into) out[name] = per.attr("copy")();
  for (const auto& [name, per] : from) {
    if (!out.contains(name)) out[name] = py::dict();
    py::dict mine(out[name]);
    for (const auto& [source, entry] : py::reinterpret_borrow<py::dict>(per)) {
      if (!mine.contains(source) || py::object(entry[py::int_(0)]).cast<double>() >=
                                        py::object(mine[source][py::int_(0)]).cast<double>()) {
        mine[source] = entry;
      }
    }
  }
  return out;
}

py::object sum_over_sources(const py::dict& per) {
  py::object total = py::int_(0);
  for (const auto& [source, entry] : per) total = total + py::object(entry[py::int_(1)]);
  return total;
}

std::string yes_no(bool b) { return b ? "true" : "false"; }

// The info metric's label values, in kConfigInfoLabels' order. The store
// path itself is not shown (a label should not carry a file system path):
// only whether one is set. Streaming's labels are empty with streaming off.
py::list config_labels(const Config& c) {
  const bool streaming = c.streaming.has_value();
  const auto opt = [&](auto f) { return streaming ? f(*c.streaming) : std::string(); };
  py::list out;
  out.append(mode_name(c.mode));
  out.append(std::to_string(c.capacity_bytes));
  out.append(std::to_string(c.store_threshold));
  out.append(std::to_string(c.max_bytes_per_request));
  out.append(c.store_blocks == StoreScope::kPrompt ? "prompt" : "prompt_and_decode");
  out.append(std::to_string(c.fence_timeout_ms));
  out.append(yes_no(!c.store_path.empty()));
  out.append(yes_no(streaming));
  out.append(opt([](const StreamingConfig& s) { return std::to_string(s.resident_layers); }));
  out.append(opt([](const StreamingConfig& s) { return std::to_string(s.ring_size); }));
  out.append(opt([](const StreamingConfig& s) { return std::string(mode_name(s.homes)); }));
  out.append(std::to_string(c.async_load_min_tokens));
  return out;
}

}  // namespace

py::object stats_or_none(const Telemetry& t, const std::string& source) {
  if (t.empty()) return py::none();
  return g_classes->stats("data"_a = telemetry_dict(t, source));
}

py::dict stats_namespace() {
  py::dict ns;
  ns["reset"] = named("reset", [](py::object self) {
    py::dict data = self.attr("data");
    for (const auto& n : kCounterNames) data[name_of(n)] = 0;
    data[kGaugesKey] = py::dict();
  });
  ns["aggregate"] = named("aggregate", [](py::object self, py::object other) {
    py::dict data = self.attr("data");
    py::dict theirs = other.attr("data");
    for (const auto& n : kCounterNames) {
      const py::str k = name_of(n);
      data[k] = data.attr("get")(k, 0) + theirs.attr("get")(k, 0);
    }
    data[kGaugesKey] = merge_latest(gauges_of(data), gauges_of(theirs));
    return self;
  });
  // The counters' sums, and each gauge reported in the interval: the sum over
  // its sources of their latest values.
  ns["reduce"] = named("reduce", [](py::object self) {
    py::dict data = self.attr("data");
    py::dict out;
    for (const auto& n : kCounterNames) out[name_of(n)] = data.attr("get")(name_of(n), 0);
    const py::dict gauges = gauges_of(data);
    for (const auto& n : kGaugeNames) {
      if (gauges.contains(name_of(n))) out[name_of(n)] = sum_over_sources(py::dict(gauges[name_of(n)]));
    }
    return out;
  });
  ns["is_empty"] = named("is_empty", [](py::object self) {
    py::dict data = self.attr("data");
    for (const auto& n : kCounterNames) {
      if (py::cast<bool>(data.attr("get")(name_of(n), 0))) return false;
    }
    for (const auto& [name, per] : gauges_of(data)) {
      if (py::len(per) != 0) return false;
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
    const auto children = [&](const py::object& metric) {
      py::dict per;
      for (const auto& [idx, values] : per_engine) per[idx] = metric.attr("labels")(*values);
      return per;
    };
    py::dict counters;
    for (std::size_t i = 0; i < kCounterNames.size(); ++i) {
      counters[name_of(kCounterNames[i])] = children(
          self.attr("_counter_cls")("name"_a = kPrefix + std::string(kCounterNames[i]),
                                    "documentation"_a = name_of(kCounterHelp[i]), "labelnames"_a = labels));
    }
    py::dict gauges;
    for (std::size_t i = 0; i < kGaugeNames.size(); ++i) {
      gauges[name_of(kGaugeNames[i])] = children(self.attr("_gauge_cls")(
          "name"_a = kPrefix + std::string(kGaugeNames[i]), "documentation"_a = name_of(kGaugeHelp[i]),
          "multiprocess_mode"_a = "mostrecent", "labelnames"_a = labels));
    }
    // The configuration: one gauge set to 1 per engine (vLLM's own
    // cache_config_info does the same; Prometheus's Info has no
    // multiprocess mode).
    py::list info_labels;  // a new list: vLLM's labelnames stay as they are
    for (const auto& l : labels) info_labels.append(l);
    for (const auto& l : kConfigInfoLabels) info_labels.append(name_of(l));
    const py::object info = self.attr("_gauge_cls")(
        "name"_a = kPrefix + std::string(kConfigInfoName), "documentation"_a = name_of(kConfigInfoHelp),
        "multiprocess_mode"_a = "mostrecent", "labelnames"_a = info_labels);
    const py::list config =
        config_labels(parse_config(vllm_config.attr("kv_transfer_config").attr("kv_connector_extra_config")));
    for (const auto& [idx, values] : per_engine) {
      const py::object all = py::list(py::reinterpret_borrow<py::object>(values)) + config;
      info.attr("labels")(*all).attr("set")(1);
    }
    self.attr("_activekv_counters") = counters;
    self.attr("_activekv_gauges") = gauges;
    self.attr("_activekv_latest") = py::dict();  // engine -> gauge -> source -> [seq, value]
  });
  ns["observe"] = named(
      "observe",
      [](py::object self, py::dict data, py::int_ engine_idx) {
        py::dict counters = self.attr("_activekv_counters");
        for (const auto& [name, per] : counters) {
          const py::object v = data.attr("get")(name, 0);
          if (py::cast<bool>(v)) per[engine_idx].attr("inc")(v);
        }
        const py::dict reported = gauges_of(data);
        if (py::len(reported) == 0) return;
        py::dict latest_all = self.attr("_activekv_latest");
        if (!latest_all.contains(engine_idx)) latest_all[engine_idx] = py::dict();
        const py::dict latest = merge_latest(py::dict(latest_all[engine_idx]), reported);
        latest_all[engine_idx] = latest;
        py::dict gauges = self.attr("_activekv_gauges");
        for (const auto& [name, per] : reported) {
          if (!gauges.contains(name)) continue;  // a newer engine's gauge: not ours to show
          gauges[name][engine_idx].attr("set")(sum_over_sources(py::dict(latest[name])));
        }
      },
      "transfer_stats_data"_a, "engine_idx"_a = 0);
  return ns;
}

py::dict telemetry_names() {
  py::dict counters, gauges, info;
  for (std::size_t i = 0; i < kCounterNames.size(); ++i)
    counters[name_of(kCounterNames[i])] = name_of(kCounterHelp[i]);
  for (std::size_t i = 0; i < kGaugeNames.size(); ++i)
    gauges[name_of(kGaugeNames[i])] = name_of(kGaugeHelp[i]);
  py::list labels;
  for (const auto& l : kConfigInfoLabels) labels.append(name_of(l));
  info["name"] = name_of(kConfigInfoName);
  info["help"] = name_of(kConfigInfoHelp);
  info["labels"] = labels;
  py::dict out;
  out["counters"] = counters;
  out["gauges"] = gauges;
  out["info"] = info;
  return out;
}

}  // namespace activekv::bindings
