#include "convert.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "errors.h"
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

// The metadata's fields, each listed once (kPlanFields, kReportFields): the
// conversions both ways and the shared empty metadata go by these lists.
template <class Owner, class T>
struct Field {
  const char* name;  // the Python attribute
  T Owner::* member;
  // Read as empty when the attribute is absent.
  bool may_be_absent = false;
};

// ActiveKVMetadata, scheduler -> workers.
constexpr std::tuple kPlanFields{
    Field{"loads", &StepPlan::loads},
    // Absent on metadata made before asynchronous loads: none.
    Field{"async_loads", &StepPlan::async_loads, true},
    Field{"saves", &StepPlan::saves},
    Field{"awaiting_free", &StepPlan::awaiting_free},
    // Absent on metadata made without streaming in mind: nothing to stage.
    Field{"stage_blocks", &StepPlan::stage_blocks, true},
    Field{"stage_rows", &StepPlan::stage_rows, true},
    Field{"writeback_blocks", &StepPlan::writeback_blocks, true},
    Field{"writeback_rows", &StepPlan::writeback_rows, true},
};

// ActiveKVWorkerMetadata, workers -> scheduler.
constexpr std::tuple kReportFields{
    Field{"saved", &WorkerReport::saved},
    Field{"failed_saves", &WorkerReport::failed_saves},
    Field{"loaded", &WorkerReport::loaded},
    Field{"failed_loads", &WorkerReport::failed_loads},
    Field{"quarantined", &WorkerReport::quarantined},
};

// A field's value in Python: a load as (slot, block_id, key), a save as
// (slot, block_id, key, req_id), ids and request ids as lists.
py::object to_python(const std::vector<LoadOp>& ops) {
  py::list out;
  for (const auto& op : ops) out.append(py::make_tuple(op.slot, op.block_id, to_bytes(op.key)));
  return out;
}

// An asynchronous load as (req_id, [its loads]).
py::object to_python(const std::vector<AsyncLoad>& loads) {
  py::list out;
  for (const auto& load : loads) out.append(py::make_tuple(load.req_id, to_python(load.loads)));
  return out;
}

py::object to_python(const std::vector<SaveOp>& ops) {
  py::list out;
  for (const auto& op : ops) out.append(py::make_tuple(op.slot, op.block_id, to_bytes(op.key), op.req_id));
  return out;
}

template <class T>
py::object to_python(const std::vector<T>& values) {
  return py::cast(values);
}

void from_python(const py::handle& list, std::vector<LoadOp>& ops) {
  for (const auto& t : list) {
    ops.push_back({py::cast<std::int64_t>(t[py::int_(0)]), py::cast<std::int64_t>(t[py::int_(1)]),
                   to_key(t[py::int_(2)])});
  }
}

void from_python(const py::handle& list, std::vector<AsyncLoad>& loads) {
  for (const auto& t : list) {
    AsyncLoad& load = loads.emplace_back(AsyncLoad{py::cast<std::string>(t[py::int_(0)]), {}});
    from_python(t[py::int_(1)], load.loads);
  }
}

void from_python(const py::handle& list, std::vector<SaveOp>& ops) {
  for (const auto& t : list) {
    ops.push_back({py::cast<std::int64_t>(t[py::int_(0)]), py::cast<std::int64_t>(t[py::int_(1)]),
                   to_key(t[py::int_(2)]), py::cast<std::string>(t[py::int_(3)])});
  }
}

template <class T>
void from_python(const py::handle& list, std::vector<T>& values) {
  values = py::cast<std::vector<T>>(list);
}

template <class Owner, class... T>
void write_fields(const py::handle& meta, const Owner& value, const std::tuple<Field<Owner, T>...>& fields) {
  std::apply([&](const auto&... f) { ((meta.attr(f.name) = to_python(value.*f.member)), ...); }, fields);
}

template <class Owner, class T>
void read_field(const py::handle& meta, const Field<Owner, T>& field, T& out) {
  if (!field.may_be_absent) return from_python(meta.attr(field.name), out);
  const py::object value = py::getattr(meta, field.name, py::none());
  if (!value.is_none()) from_python(value, out);
}

template <class Owner, class... T>
Owner read_fields(const py::handle& meta, const std::tuple<Field<Owner, T>...>& fields) {
  Owner value;
  std::apply([&](const auto&... f) { (read_field(meta, f, value.*f.member), ...); }, fields);
  return value;
}

}  // namespace

py::bytes to_bytes(const BlockKey& key) { return {reinterpret_cast<const char*>(key.data()), key.size()}; }

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
  return value_or_raise(Config::parse(to_config_values(extra)));
}

c10::ScalarType dtype_from_python(const py::handle& dtype) {
  const auto name = py::cast<std::string>(py::str(dtype));
  if (name == "torch.bfloat16") return c10::ScalarType::BFloat16;
  if (name == "torch.float16") return c10::ScalarType::Half;
  if (name == "torch.float32") return c10::ScalarType::Float;
  raise_layout_error("ActiveKV does not support KV cache dtype " + name);
}

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::BFloat16:
      return "bfloat16";
    case c10::ScalarType::Half:
      return "float16";
    case c10::ScalarType::Float:
      return "float32";
    default:
      return c10::toString(t);
  }
}

py::object new_metadata(const StepPlan& plan) {
  py::object meta = new_instance(g_classes->metadata);
  write_fields(meta, plan, kPlanFields);
  return meta;
}

py::object plan_to_python(const StepPlan& plan) {
  if (plan.empty()) return g_classes->empty_metadata;
  return new_metadata(plan);
}

StepPlan plan_from_python(const py::handle& meta) {
  if (meta.is(g_classes->empty_metadata)) return {};
  if (!py::isinstance(meta, g_classes->metadata)) {
    throw py::type_error("ActiveKV got connector metadata of type " +
                         py::cast<std::string>(py::type::handle_of(meta).attr("__name__")));
  }
  return read_fields(meta, kPlanFields);
}

py::object report_to_python(const WorkerReport& r) {
  py::object meta = new_instance(g_classes->worker_meta);
  write_fields(meta, r, kReportFields);
  return meta;
}

WorkerReport report_from_python(const py::handle& meta) { return read_fields(meta, kReportFields); }

}  // namespace activekv::bindings
