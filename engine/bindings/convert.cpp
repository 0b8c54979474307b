#include "convert.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "vllm_classes.h"

namespace activekv::bindings {
namespace {

ConfigValue to_config_value(const py::handle& v) {
  ConfigValue cv;
  cv.type_name = py::cast<std::string>(py::type::handle_of(v).attr("__name__"));
  cv.repr = py::cast<std::string>(py::repr(v));
  if (v.is_none()) {
    cv.kind = ConfigValue::Kind::kNone;
  } else if (py::isinstance<py::bool_>(v)) {
    cv.kind = ConfigValue::Kind::kBool;
  } else if (py::isinstance<py::int_>(v)) {
    cv.kind = ConfigValue::Kind::kInt;
    cv.int_value = py::cast<std::int64_t>(v);
  } else if (py::isinstance<py::str>(v)) {
    cv.kind = ConfigValue::Kind::kString;
    cv.string_value = py::cast<std::string>(v);
  } else if (py::isinstance<py::dict>(v)) {  // a table (streaming)
    cv.kind = ConfigValue::Kind::kTable;
    cv.table = to_config_values(v);
  }
  return cv;
}

}  // namespace

py::bytes to_bytes(const BlockKey& key) {
  return {reinterpret_cast<const char*>(key.data()), key.size()};
}

BlockKey to_key(const py::handle& b) {
  const std::string s = py::cast<std::string>(b);
  if (s.size() != BlockKey{}.size()) throw py::value_error("block key must be 32 bytes");
  BlockKey k;
  std::copy(s.begin(), s.end(), k.begin());
  return k;
}

std::map<std::string, ConfigValue> to_config_values(const py::handle& extra) {
  std::map<std::string, ConfigValue> out;
  if (extra.is_none()) return out;
  for (const auto& [k, v] : py::cast<py::dict>(extra)) {
    out.emplace(py::cast<std::string>(py::str(k)), to_config_value(v));
  }
  return out;
}

Config parse_config(const py::handle& extra) {
  auto parsed = Config::parse(to_config_values(extra));
  if (!parsed.ok()) throw py::value_error(parsed.status().error());
  return parsed.value();
}

c10::ScalarType dtype_from_python(const py::handle& dtype) {
  const auto name = py::cast<std::string>(py::str(dtype));
  if (name == "torch.bfloat16") return c10::ScalarType::BFloat16;
  if (name == "torch.float16") return c10::ScalarType::Half;
  if (name == "torch.float32") return c10::ScalarType::Float;
  throw py::value_error("ActiveKV does not support KV cache dtype " + name);
}

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::Float: return "float32";
    default: return c10::toString(t);
  }
}

py::object plan_to_python(const StepPlan& plan) {
  if (plan.empty()) return g_classes->empty_metadata;
  py::object meta = new_instance(g_classes->metadata);
  py::list loads, saves;
  for (const auto& op : plan.loads) loads.append(py::make_tuple(op.slot, op.block_id, to_bytes(op.key)));
  for (const auto& op : plan.saves) {
    saves.append(py::make_tuple(op.slot, op.block_id, to_bytes(op.key), op.req_id));
  }
  meta.attr("loads") = loads;
  meta.attr("saves") = saves;
  meta.attr("awaiting_free") = py::cast(plan.awaiting_free);
  meta.attr("stage_blocks") = py::cast(plan.stage_blocks);
  meta.attr("writeback_blocks") = py::cast(plan.writeback_blocks);
  return meta;
}

StepPlan plan_from_python(const py::handle& meta) {
  if (meta.is(g_classes->empty_metadata)) return {};
  if (!py::isinstance(meta, g_classes->metadata)) {
    throw py::type_error("ActiveKV got connector metadata of type " +
                         py::cast<std::string>(py::type::handle_of(meta).attr("__name__")));
  }
  StepPlan plan;
  for (const auto& t : meta.attr("loads")) {
    plan.loads.push_back({py::cast<std::int64_t>(t[py::int_(0)]), py::cast<std::int64_t>(t[py::int_(1)]),
                          to_key(t[py::int_(2)])});
  }
  for (const auto& t : meta.attr("saves")) {
    plan.saves.push_back({py::cast<std::int64_t>(t[py::int_(0)]), py::cast<std::int64_t>(t[py::int_(1)]),
                          to_key(t[py::int_(2)]), py::cast<std::string>(t[py::int_(3)])});
  }
  plan.awaiting_free = py::cast<std::vector<std::string>>(meta.attr("awaiting_free"));
  // Absent on metadata made without streaming in mind: nothing to stage.
  for (auto [name, ids] : {std::pair{"stage_blocks", &plan.stage_blocks},
                           std::pair{"writeback_blocks", &plan.writeback_blocks}}) {
    const py::object list = py::getattr(meta, name, py::none());
    if (!list.is_none()) *ids = py::cast<std::vector<std::int64_t>>(list);
  }
  return plan;
}

py::object report_to_python(const WorkerReport& r) {
  py::object meta = new_instance(g_classes->worker_meta);
  meta.attr("saved") = py::cast(r.saved);
  meta.attr("failed_saves") = py::cast(r.failed_saves);
  meta.attr("loaded") = py::cast(r.loaded);
  meta.attr("failed_loads") = py::cast(r.failed_loads);
  meta.attr("quarantined") = py::cast(r.quarantined);
  return meta;
}

WorkerReport report_from_python(const py::handle& meta) {
  WorkerReport r;
  r.saved = py::cast<std::vector<std::int64_t>>(meta.attr("saved"));
  r.failed_saves = py::cast<std::vector<std::int64_t>>(meta.attr("failed_saves"));
  r.loaded = py::cast<std::vector<std::int64_t>>(meta.attr("loaded"));
  r.failed_loads = py::cast<std::vector<std::int64_t>>(meta.attr("failed_loads"));
  r.quarantined = py::cast<std::vector<std::int64_t>>(meta.attr("quarantined"));
  return r;
}

}  // namespace activekv::bindings
