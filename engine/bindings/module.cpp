// The pybind11 module `activekv`: small adapters between vLLM's Python objects
// and the native engine, and the vLLM-facing classes built at import time.
//
// vLLM's factory reads the connector's constructor signature and checks
// isinstance(..., KVConnectorBase_V1), so the connector is a real subclass made
// with the base's own metaclass; its methods are native functions. Each method
// takes what it needs from the Python arguments under the GIL, then releases
// the GIL for the native work. Nothing here calls back into Python objects of
// ours on a per-step path: per step, only vLLM's arguments are read.
#include <ATen/DeviceAccelerator.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "activekv/config.h"
#include "activekv/device_check.h"
#include "activekv/kv_layout.h"
#include "activekv/layer_streaming.h"
#include "activekv/scheduler_side.h"
#include "activekv/telemetry.h"
#include "activekv/worker_side.h"
#include "vllm_features.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace activekv {
namespace {

constexpr const char* kModule = "activekv";
constexpr const char* kConnectorName = "ActiveKVConnector";

// ---- conversions ------------------------------------------------------------

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

std::map<std::string, ConfigValue> to_config_values(const py::handle& extra);

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

// What check_streamable needs of vLLM's config, read once at start-up, in the
// reference's order and no further than its first refusal (so a config
// lacking a later field fails in both engines alike).
StreamableFacts streamable_facts(const py::handle& vllm_config, const py::handle& kv_cache_groups) {
  StreamableFacts f;
  const py::object model = vllm_config.attr("model_config");
  f.use_mla = py::cast<bool>(py::bool_(py::getattr(model, "use_mla", py::bool_(false))));
  if (f.use_mla) return f;
  const py::list groups(py::reinterpret_borrow<py::object>(kv_cache_groups));
  const py::object full = py::module_::import("vllm.v1.kv_cache_interface").attr("FullAttentionSpec");
  for (const auto& g : groups) {
    f.group_kinds.push_back(py::cast<std::string>(py::type::handle_of(g.attr("kv_cache_spec")).attr("__name__")));
  }
  f.one_full_attention_group =
      groups.size() == 1 && py::type::handle_of(groups[0].attr("kv_cache_spec")).is(full);
  if (!f.one_full_attention_group) return f;
  f.sliding_window = !py::getattr(groups[0].attr("kv_cache_spec"), "sliding_window", py::none()).is_none();
  if (f.sliding_window) return f;
  const py::object parallel = vllm_config.attr("parallel_config");
  f.attention_layers = py::cast<std::int64_t>(
      model.attr("get_num_layers_by_block_type")(parallel, "attention"));
  f.kv_cache_layers = static_cast<std::int64_t>(py::len(groups[0].attr("layer_names")));
  if (f.attention_layers != f.kv_cache_layers) return f;
  f.speculative = !vllm_config.attr("speculative_config").is_none();
  if (f.speculative) return f;
  f.pipeline_parallel_size = py::cast<std::int64_t>(parallel.attr("pipeline_parallel_size"));
  return f;
}

// The geometry for a streaming config, after vLLM's settings were checked;
// ValueError with the reference's message otherwise. The layer names are the
// one group's, read only once the check passed (as the reference does).
StreamingGeometry streaming_geometry(const StreamingConfig& streaming, const py::handle& vllm_config,
                                     const py::handle& kv_cache_groups) {
  if (const Status s = check_streamable(streamable_facts(vllm_config, kv_cache_groups)); !s.ok()) {
    throw py::value_error(s.error());
  }
  const auto layer_names = py::cast<std::vector<std::string>>(
      py::list(py::reinterpret_borrow<py::object>(kv_cache_groups))[0].attr("layer_names"));
  auto geometry = StreamingGeometry::plan(streaming, layer_names);
  if (!geometry.ok()) throw py::value_error(geometry.status().error());
  return geometry.value();
}

c10::ScalarType dtype_from_python(const py::handle& dtype) {
  const auto name = py::cast<std::string>(py::str(dtype));
  if (name == "torch.bfloat16") return c10::ScalarType::BFloat16;
  if (name == "torch.float16") return c10::ScalarType::Half;
  if (name == "torch.float32") return c10::ScalarType::Float;
  throw py::value_error("ActiveKV does not support KV cache dtype " + name);
}

KVLayout layout_of(const py::handle& kv_cache_config) {
  const py::module_ iface = py::module_::import("vllm.v1.kv_cache_interface");
  const py::list groups = kv_cache_config.attr("kv_cache_groups");
  py::list kinds;
  for (const auto& g : groups) kinds.append(py::type::handle_of(g.attr("kv_cache_spec")).attr("__name__"));
  if (groups.size() != 1 ||
      !py::type::handle_of(groups[0].attr("kv_cache_spec")).is(iface.attr("FullAttentionSpec"))) {
    throw py::value_error(
        "ActiveKV supports models with one full-attention KV cache group; this model has " +
        py::cast<std::string>(py::repr(kinds)));
  }
  const py::object spec = groups[0].attr("kv_cache_spec");
  if (!spec.attr("head_size_v").equal(spec.attr("head_size"))) {
    throw py::value_error("ActiveKV needs K and V heads of the same size");
  }
  KVLayout layout;
  layout.layer_names = py::cast<std::vector<std::string>>(groups[0].attr("layer_names"));
  layout.block_size = py::cast<std::int64_t>(spec.attr("block_size"));
  layout.num_kv_heads = py::cast<std::int64_t>(spec.attr("num_kv_heads"));
  layout.head_size = py::cast<std::int64_t>(spec.attr("head_size"));
  layout.dtype = dtype_from_python(spec.attr("dtype"));
  return layout;
}

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::Float: return "float32";
    default: return c10::toString(t);
  }
}

py::dict telemetry_dict(const Telemetry& t) {
  py::dict d;
  for (std::size_t i = 0; i < kCounterNames.size(); ++i) {
    d[py::str(std::string(kCounterNames[i]))] = t.get(static_cast<Counter>(i));
  }
  return d;
}

// Attribute names used on every step, made once: pybind11's attr("...") makes
// a new str on every call, and hasattr raises and clears an exception for a
// missing name. Never freed: they live as long as the interpreter.
PyObject* interned(const char* name) {
  PyObject* key = PyUnicode_InternFromString(name);
  if (key == nullptr) throw py::error_already_set();
  return key;
}
struct Keys {
  PyObject* scheduler = interned("_activekv_scheduler");
  PyObject* worker = interned("_activekv_worker");
  PyObject* metadata = interned("_connector_metadata");
  // vLLM's SchedulerOutput, read on every step.
  PyObject* num_scheduled_tokens = interned("num_scheduled_tokens");
  PyObject* scheduled_new_reqs = interned("scheduled_new_reqs");
  PyObject* scheduled_cached_reqs = interned("scheduled_cached_reqs");
  PyObject* req_ids = interned("req_ids");
  PyObject* resumed_req_ids = interned("resumed_req_ids");
  PyObject* new_block_ids = interned("new_block_ids");
  PyObject* num_computed_tokens = interned("num_computed_tokens");
};
const Keys& keys() {
  static const Keys k;  // first used with the GIL held
  return k;
}

// obj.<key>, a key of keys().
py::object get(const py::handle& obj, PyObject* key) {
  PyObject* value = PyObject_GetAttr(obj.ptr(), key);
  if (value == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(value);
}

// ---- the two sides, as held by a connector instance ---------------------------

class SchedulerEngine {
 public:
  SchedulerEngine(std::unique_ptr<SchedulerSide> side) : side_(std::move(side)) {}

  // Brings the engine's copy of the request's token ids up to date.
  void sync(const py::handle& request) {
    const std::string id = py::cast<std::string>(request.attr("request_id"));
    const std::int64_t known = side_->known_tokens(id);
    const py::object all = request.attr("all_token_ids");
    if (known == 0) requests_[py::str(id)] = request;
    if (py::len(all) <= static_cast<std::size_t>(known)) return;
    const auto fresh = py::cast<std::vector<std::int64_t>>(
        all[py::slice(known, static_cast<py::ssize_t>(py::len(all)), 1)]);
    const py::object salt = request.attr("cache_salt");
    side_->observe_request(id, salt.is_none() ? std::nullopt : std::optional(py::cast<std::string>(salt)),
                           py::cast<std::int64_t>(request.attr("num_prompt_tokens")), fresh);
  }

  py::tuple get_num_new_matched_tokens(const py::handle& request, std::int64_t num_computed) {
    sync(request);
    const std::string id = py::cast<std::string>(request.attr("request_id"));
    std::int64_t n;
    {
      py::gil_scoped_release nogil;
      n = side_->get_num_new_matched_tokens(id, num_computed);
    }
    return py::make_tuple(n, false);
  }

  void update_state_after_alloc(const py::handle& request, const py::handle& blocks, std::int64_t n) {
    const std::string id = py::cast<std::string>(request.attr("request_id"));
    std::vector<std::int64_t> ids;
    if (n > 0) ids = py::cast<std::vector<std::int64_t>>(blocks.attr("get_block_ids")()[py::int_(0)]);
    py::gil_scoped_release nogil;
    side_->update_state_after_alloc(id, ids, n);
  }

  StepPlan build(const py::handle& so) {
    const Keys& k = keys();
    const py::dict scheduled = get(so, k.num_scheduled_tokens);
    std::vector<SchedulerSide::NewRequest> fresh;
    for (const auto& r : get(so, k.scheduled_new_reqs)) {
      const py::object key = r.attr("req_id");
      const auto id = py::cast<std::string>(key);
      if (py::handle request = known_request(key)) sync(request);  // new: read once
      fresh.push_back({id, py::cast<std::vector<std::int64_t>>(r.attr("block_ids")[py::int_(0)]),
                       py::cast<std::int64_t>(r.attr("num_computed_tokens")),
                       py::cast<std::int64_t>(scheduled[key])});
    }
    const py::object cached = get(so, k.scheduled_cached_reqs);
    const py::list ids = get(cached, k.req_ids);
    const py::object resumed = get(cached, k.resumed_req_ids);
    const py::list new_block_ids = get(cached, k.new_block_ids);
    const py::list computed = get(cached, k.num_computed_tokens);
    std::vector<SchedulerSide::CachedRequest> running;
    running.reserve(ids.size());
    // Every running request, every step: CPython's calls directly, each value
    // read once (py::object::contains and operator[] go through attribute
    // lookups and new objects).
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const py::handle key = PyList_GET_ITEM(ids.ptr(), static_cast<py::ssize_t>(i));
      const auto id = py::cast<std::string>(key);
      PyObject* n = PyDict_GetItemWithError(scheduled.ptr(), key.ptr());
      if (n == nullptr) {
        if (PyErr_Occurred()) throw py::error_already_set();
        throw py::key_error("ActiveKV: running request " + id + " has no num_scheduled_tokens entry");
      }
      const auto num_scheduled = py::cast<std::int64_t>(py::handle(n));
      const auto num_computed = py::cast<std::int64_t>(computed[i]);
      if (side_->wants_tokens(id, num_computed + num_scheduled)) {
        if (py::handle request = known_request(key)) sync(request);
      }
      std::optional<std::vector<std::int64_t>> blocks;
      const py::handle added = PyList_GET_ITEM(new_block_ids.ptr(), static_cast<py::ssize_t>(i));
      if (!added.is_none()) blocks = py::cast<std::vector<std::int64_t>>(added[py::int_(0)]);
      const int is_resumed = PySequence_Contains(resumed.ptr(), key.ptr());
      if (is_resumed < 0) throw py::error_already_set();
      running.push_back({id, is_resumed == 1, std::move(blocks), num_computed, num_scheduled});
    }
    py::gil_scoped_release nogil;
    return side_->build_step(fresh, running);
  }

  void apply(const WorkerReport& report) {
    py::gil_scoped_release nogil;
    side_->apply_report(report);
  }

  bool request_finished(const py::handle& request) {
    const auto id = py::cast<std::string>(request.attr("request_id"));
    const py::str key(id);
    if (known_request(key) && PyDict_DelItem(requests_.ptr(), key.ptr()) != 0) throw py::error_already_set();
    py::gil_scoped_release nogil;
    return side_->request_finished(id);
  }

  bool has_pending_work() const { return side_->has_pending_work(); }
  Telemetry take_telemetry() { return side_->take_telemetry(); }

 private:
  // The vLLM request of this id, or a null handle (borrowed from requests_).
  py::handle known_request(const py::handle& id) const {
    PyObject* request = PyDict_GetItemWithError(requests_.ptr(), id.ptr());
    if (request == nullptr && PyErr_Occurred()) throw py::error_already_set();
    return request;
  }

  std::unique_ptr<SchedulerSide> side_;
  py::dict requests_;  // request id -> vllm Request, for its growing token ids
};

// ---- Python-side classes made at import ----------------------------------------

struct Classes {
  py::object base;            // KVConnectorBase_V1
  py::object metadata;        // ActiveKVMetadata
  py::object empty_metadata;  // one shared instance for the steps that move nothing
  py::object worker_meta;     // ActiveKVWorkerMetadata
  py::object stats;           // ActiveKVStats
  py::object prom;            // ActiveKVPromMetrics
  VllmFeatures features;      // what the running vLLM offers (vllm_features.h)
};
Classes* g_classes = nullptr;  // lives as long as the module (never freed: interpreter owns it)
constexpr std::array<const char*, 5> kVllmFacing = {"ActiveKVConnector", "ActiveKVMetadata",
                                                    "ActiveKVWorkerMetadata", "ActiveKVStats",
                                                    "ActiveKVPromMetrics"};

py::object new_instance(const py::object& cls) { return cls.attr("__new__")(cls); }

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

py::object stats_or_none(const Telemetry& t) {
  if (t.empty()) return py::none();
  return g_classes->stats("data"_a = telemetry_dict(t));
}

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

// The engine object a connector instance holds in its __dict__, or null (a
// connector of the other role). Borrowed: the instance keeps it alive.
template <class Engine>
Engine* engine_in(const py::handle& self, PyObject* key) {
  PyObject* dict = PyObject_GenericGetDict(self.ptr(), nullptr);
  if (dict == nullptr) throw py::error_already_set();
  PyObject* value = PyDict_GetItemWithError(dict, key);
  Py_DECREF(dict);
  if (value == nullptr) {
    if (PyErr_Occurred()) throw py::error_already_set();
    return nullptr;
  }
  return &py::cast<Engine&>(py::handle(value));
}
WorkerSide* find_worker(const py::handle& self) { return engine_in<WorkerSide>(self, keys().worker); }

SchedulerEngine& scheduler_of(const py::handle& self) {
  auto* engine = engine_in<SchedulerEngine>(self, keys().scheduler);
  if (engine == nullptr) throw py::attribute_error("ActiveKV: a scheduler-side call on a worker-side connector");
  return *engine;
}
WorkerSide& worker_of(const py::handle& self) {
  WorkerSide* engine = find_worker(self);
  if (engine == nullptr) throw py::attribute_error("ActiveKV: a worker-side call on a scheduler-side connector");
  return *engine;
}
void set_metadata(const py::handle& self, const py::handle& meta) {
  if (PyObject_SetAttr(self.ptr(), keys().metadata, meta.ptr()) != 0) throw py::error_already_set();
}

void connector_init(py::object self, py::object vllm_config, py::object role, py::object kv_cache_config) {
  g_classes->base.attr("__init__")(self, vllm_config, role, kv_cache_config);
  const py::object transfer = self.attr("_kv_transfer_config");
  const Config config = parse_config(transfer.attr("kv_connector_extra_config"));
  const KVLayout layout = layout_of(kv_cache_config);
  const std::int64_t slot_bytes = layout.slot_bytes(config.mode);
  const std::int64_t host_bytes = physical_memory_bytes();
  const auto slots = config.store_slots(slot_bytes, host_bytes);
  if (!slots.ok()) throw py::value_error(slots.status().error());
  const std::int64_t num_slots = slots.value();
  const py::module_ base_mod = py::module_::import("vllm.distributed.kv_transfer.kv_connector.v1.base");
  const bool scheduler = role.is(base_mod.attr("KVConnectorRole").attr("SCHEDULER"));
  std::optional<StreamingGeometry> geometry;
  std::optional<StartupReport> report;
  if (config.streaming) {
    if (!g_classes->features.streaming_hooks) {
      throw py::value_error(
          "ActiveKV layer streaming needs vLLM with ActiveKV's patch series (patches/vllm/" +
          g_classes->features.version + "/0002: KVConnectorBase_V1.get_kv_cache_regions); this vLLM " +
          g_classes->features.version + " is not patched: install the patched wheel "
          "(python3 ci/run-nox -s patch-vllm) or remove 'streaming' from kv_connector_extra_config");
    }
    geometry = streaming_geometry(*config.streaming, vllm_config, kv_cache_config.attr("kv_cache_groups"));
    const auto num_blocks = py::cast<std::int64_t>(kv_cache_config.attr("num_blocks"));
    report = StartupReport::of(
        *geometry, num_blocks, layout.block_size, layout.layer_bytes(Mode::kExact),
        py::cast<std::int64_t>(vllm_config.attr("model_config").attr("max_model_len")));
    if (const Status s = report->check_host_memory(config.capacity_bytes, host_bytes); !s.ok()) {
      throw py::value_error(s.error());
    }
    if (scheduler) {
      // Under vLLM's logger: its handlers print it, as they do vLLM's own start-up lines.
      py::module_::import("logging").attr("getLogger")("vllm.activekv").attr("info")("%s", report->line());
    }
  }
  if (scheduler) {
    ModelIdentity id{py::cast<std::string>(py::str(vllm_config.attr("model_config").attr("model"))),
                     dtype_name(layout.dtype),
                     static_cast<std::int64_t>(layout.layer_names.size()),
                     layout.num_kv_heads,
                     layout.head_size,
                     layout.block_size,
                     py::cast<std::int64_t>(vllm_config.attr("parallel_config").attr("tensor_parallel_size"))};
    auto side = std::make_unique<SchedulerSide>(config, id.digest(), layout.block_size, slot_bytes,
                                                num_slots, id.tp_size, geometry.has_value());
    if (report) side->report_streaming(*report);
    self.attr("_activekv_scheduler") = py::cast(SchedulerEngine(std::move(side)));
  } else {
    const auto rank = py::cast<std::int64_t>(
        py::module_::import("vllm.distributed.parallel_state").attr("get_tensor_model_parallel_rank")());
    self.attr("_activekv_worker") =
        py::cast(std::make_unique<WorkerSide>(config, layout, num_slots, rank, std::move(geometry)));
  }
}

py::dict connector_namespace() {
  py::dict ns;
  ns["__module__"] = kModule;
  ns["__doc__"] = "ActiveKV: vLLM's KV cache in host RAM (native engine).";
  ns["__init__"] = method(&connector_init);
  const py::module_ inspect = py::module_::import("inspect");
  const py::object P = inspect.attr("Parameter");
  const py::object kind = P.attr("POSITIONAL_OR_KEYWORD");
  // What vLLM's factory inspects (a class's signature, so without self).
  ns["__signature__"] = inspect.attr("Signature")(
      py::make_tuple(P("vllm_config", kind), P("role", kind), P("kv_cache_config", kind)));
  if (g_classes->features.cache_hit_source) {  // 0.32.0 labels host hits; 0.26.0 has no label
    ns["_cache_hit_source"] =
        py::module_::import("vllm.v1.metrics.cache_hit_source").attr("CacheHitSource").attr("HOST");
  }
  ns["requires_kv_delivery"] = py::module_::import("builtins").attr("property")(
      method([](py::object) { return false; }));  // a dropped save is only a future miss

  // -- worker --
  ns["register_kv_caches"] = named("register_kv_caches", [](py::object self, py::dict kv_caches) {
    std::unordered_map<std::string, at::Tensor> caches;
    for (const auto& [k, v] : kv_caches) caches.emplace(py::cast<std::string>(k), py::cast<at::Tensor>(v));
    const Status s = worker_of(self).register_kv_caches(caches);
    if (!s.ok()) throw py::value_error(s.error());
  });
  ns["bind_connector_metadata"] = named("bind_connector_metadata", [](py::object self, py::object meta) {
    set_metadata(self, meta);
    if (WorkerSide* w = find_worker(self)) w->bind_plan(plan_from_python(meta));
  });
  ns["clear_connector_metadata"] = named("clear_connector_metadata", [](py::object self) {
    set_metadata(self, py::none());
    if (WorkerSide* w = find_worker(self)) w->clear_plan();
  });
  ns["start_load_kv"] = named("start_load_kv", [](py::object self, py::object, py::kwargs) {
    WorkerSide& w = worker_of(self);
    if (!w.has_loads() && !w.has_stream_work()) return;
    py::gil_scoped_release nogil;
    w.start_load();
  });
  // Asked once per layer by a vLLM carrying patches/vllm/<version>/0001 (never
  // by an unpatched one): false on a step that moves no block, so vLLM skips
  // wait_for_layer_load and save_kv_layer for every layer of that step.
  ns["has_layer_work"] = named("has_layer_work", [](py::object self) {
    const WorkerSide* w = find_worker(self);
    return w != nullptr && w->has_layer_work();
  });
  // Layer streaming stages whole blocks: vLLM (patch 0002) then calls
  // wait_for_layer_load before each layer's KV cache update as well.
  ns["loads_before_kv_cache_update"] = named("loads_before_kv_cache_update", [](py::object self) {
    const WorkerSide* w = find_worker(self);
    return w != nullptr && w->streaming();
  });
  ns["wait_for_layer_load"] = named("wait_for_layer_load", [](py::object self, py::str layer) {
    WorkerSide& w = worker_of(self);
    if (!w.has_layer_loads()) return;
    const auto name = py::cast<std::string>(layer);
    py::gil_scoped_release nogil;
    w.wait_for_layer_load(name);
  });
  ns["save_kv_layer"] = named("save_kv_layer", [](py::object self, py::str layer, py::handle kv, py::object, py::kwargs) {
    WorkerSide& w = worker_of(self);
    if (!w.has_saves() && !w.has_stream_work()) return;
    const auto name = py::cast<std::string>(layer);
    const auto tensor = py::cast<at::Tensor>(kv);
    py::gil_scoped_release nogil;
    w.save_layer(name, tensor);
  });
  ns["wait_for_save"] = named("wait_for_save", [](py::object self) {
    WorkerSide& w = worker_of(self);
    if (!w.has_saves()) return w.wait_for_save();  // no copy to wait for
    py::gil_scoped_release nogil;
    w.wait_for_save();
  });
  ns["get_finished"] = named("get_finished", [](py::object self, py::object finished) -> py::tuple {
    WorkerSide& w = worker_of(self);
    if (w.nothing_awaiting() && py::len(finished) == 0) return py::make_tuple(py::none(), py::none());
    const auto ids = py::cast<std::vector<std::string>>(py::list(finished));
    std::vector<std::string> done;
    {
      py::gil_scoped_release nogil;
      done = w.get_finished(ids);
    }
    py::object sending = done.empty() ? py::none() : py::object(py::set(py::cast(done)));
    return py::make_tuple(sending, py::none());
  });
  ns["get_block_ids_with_load_errors"] = named("get_block_ids_with_load_errors", [](py::object self) {
    py::set errors;  // empty on nearly every step: no list made on the way
    for (const std::int64_t block : worker_of(self).take_load_errors()) errors.add(block);
    return errors;
  });
  ns["build_connector_worker_meta"] = named("build_connector_worker_meta", [](py::object self) -> py::object {
    const WorkerReport r = worker_of(self).take_report();
    return r.empty() ? py::none() : report_to_python(r);
  });
  ns["get_kv_connector_stats"] = named("get_kv_connector_stats", [](py::object self) -> py::object {
    if (WorkerSide* w = find_worker(self)) return stats_or_none(w->take_telemetry());
    return stats_or_none(scheduler_of(self).take_telemetry());
  });

  // -- scheduler --
  ns["get_num_new_matched_tokens"] = named("get_num_new_matched_tokens", [](py::object self, py::object request, std::int64_t n) {
    return scheduler_of(self).get_num_new_matched_tokens(request, n);
  });
  ns["update_state_after_alloc"] = named("update_state_after_alloc", [](py::object self, py::object request, py::object blocks, std::int64_t n) {
    scheduler_of(self).update_state_after_alloc(request, blocks, n);
  });
  ns["build_connector_meta"] = named("build_connector_meta", [](py::object self, py::object so) {
    return plan_to_python(scheduler_of(self).build(so));
  });
  ns["update_connector_output"] = named("update_connector_output", [](py::object self, py::object output) {
    const py::object wm = output.attr("kv_connector_worker_meta");
    if (py::isinstance(wm, g_classes->worker_meta)) scheduler_of(self).apply(report_from_python(wm));
  });
  ns["request_finished"] = named("request_finished", [](py::object self, py::object request, py::object) {
    return py::make_tuple(scheduler_of(self).request_finished(request), py::none());
  });
  ns["has_pending_push_work"] = named("has_pending_push_work", [](py::object self) {
    const auto* s = engine_in<SchedulerEngine>(self, keys().scheduler);
    return s != nullptr && s->has_pending_work();
  });

  // -- telemetry --
  const py::object classmethod = py::module_::import("builtins").attr("classmethod");
  ns["build_kv_connector_stats"] = classmethod(named("build_kv_connector_stats", [](py::object, py::object data) {
    return g_classes->stats("data"_a = data.is_none() ? py::dict() : py::dict(data));
  }));
  // Every step may load, save or stage blocks in the per-layer hooks (a
  // prompt served from the store but its last token is a one-token prefill:
  // a "uniform decode" batch), and a full CUDA graph replays with no hook
  // at all. So vLLM downgrades FULL_AND_PIECEWISE to PIECEWISE for ActiveKV:
  // attention and the KV cache update run eagerly between graph pieces.
  ns["requires_piecewise_for_cudagraph"] = classmethod(named("requires_piecewise_for_cudagraph",
      [](py::object, py::object) { return true; }));
  // Layer streaming stages whole blocks with one copy per run (or a device
  // gather of whole rows): it asks for the layout whose per-layer view keeps
  // each block one contiguous row in the logical order (HND on CUDA's flash
  // attention). Other modes take vLLM's default. A config that does not parse
  // is refused by the connector's constructor, with its message.
  ns["get_required_kvcache_layout"] = classmethod(named("get_required_kvcache_layout",
      [](py::object, py::object vllm_config) -> py::object {
        const py::object transfer = vllm_config.attr("kv_transfer_config");
        if (transfer.is_none()) return py::none();
        auto parsed = Config::parse(to_config_values(transfer.attr("kv_connector_extra_config")));
        if (!parsed.ok() || !parsed.value().streaming) return py::none();
        return py::str("HND");
      }));
  // Called by vLLM's engine core at start-up (patch 0002), before any
  // connector instance exists: the regions of the device KV cache, or None.
  ns["get_kv_cache_regions"] = classmethod(named("get_kv_cache_regions",
      [](py::object, py::object vllm_config, py::object kv_cache_groups) -> py::object {
        const Config config = parse_config(
            vllm_config.attr("kv_transfer_config").attr("kv_connector_extra_config"));
        if (!config.streaming) return py::none();
        return py::cast(streaming_geometry(*config.streaming, vllm_config, kv_cache_groups).regions());
      }));
  ns["build_prom_metrics"] = classmethod(named("build_prom_metrics", 
      [](py::object, py::object vllm_config, py::object types, py::object labels, py::object per_engine) {
        return g_classes->prom(vllm_config, types, labels, per_engine);
      }));
  return ns;
}

py::object make_class(const py::object& base, const char* name, py::dict ns) {
  ns["__module__"] = kModule;
  ns["__qualname__"] = name;
  return py::type::handle_of(base)(name, py::make_tuple(base), ns);
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

// Builds the classes vLLM sees, as subclasses of vLLM's own bases, and puts
// them on the module. Must be called with the GIL held; runs once.
void make_vllm_classes(py::module_ m) {
  if (g_classes != nullptr) return;
  const py::module_ base = py::module_::import("vllm.distributed.kv_transfer.kv_connector.v1.base");
  const py::module_ metrics = py::module_::import("vllm.distributed.kv_transfer.kv_connector.v1.metrics");
  g_classes = new Classes{};  // after the imports: a missing vLLM leaves nothing half-made
  g_classes->base = base.attr("KVConnectorBase_V1");
  g_classes->features = VllmFeatures::probe(g_classes->base);
  g_classes->metadata = make_class(base.attr("KVConnectorMetadata"), "ActiveKVMetadata", py::dict());
  g_classes->empty_metadata = new_instance(g_classes->metadata);
  g_classes->empty_metadata.attr("loads") = py::list();
  g_classes->empty_metadata.attr("saves") = py::list();
  g_classes->empty_metadata.attr("awaiting_free") = py::list();
  g_classes->empty_metadata.attr("stage_blocks") = py::list();
  g_classes->empty_metadata.attr("writeback_blocks") = py::list();
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
}

// ---- the device check ----------------------------------------------------------

// check_device(device=None, *, quiet=False): the core's scenarios, run with the
// GIL released; each result is printed as it comes (a check takes seconds).
py::list check_device_from_python(const py::object& device, bool quiet) {
  std::optional<c10::Device> chosen;
  if (device.is_none()) {
    const auto type = at::accelerator::getAccelerator(false);
    chosen = type && at::accelerator::deviceCount() > 0
                 ? c10::Device(*type, at::accelerator::getDeviceIndex())
                 : c10::Device(c10::DeviceType::CPU);
  } else {
    const auto text = py::cast<std::string>(py::str(device));
    try {
      chosen = c10::Device(text);
    } catch (const c10::Error&) {
      throw py::value_error("check_device: " + text + " is not a device (e.g. 'cpu', 'cuda:0', 'xpu')");
    }
  }
  const auto report = [quiet](const CheckResult& r) {
    if (quiet) return;
    const py::gil_scoped_acquire gil;
    py::print(std::string(outcome_name(r.outcome)) + " " + r.name + " (" +
                  std::to_string(static_cast<std::int64_t>(r.seconds * 1000)) + " ms): " + r.detail,
              "flush"_a = true);
  };
  std::vector<CheckResult> results;
  {
    const py::gil_scoped_release release;
    results = check_device(*chosen, report);  // std::invalid_argument -> ValueError
  }
  py::list out;
  std::string failed;
  for (const auto& r : results) {
    out.append(py::dict("name"_a = r.name, "outcome"_a = outcome_name(r.outcome), "detail"_a = r.detail,
                        "seconds"_a = r.seconds));
    if (r.outcome == CheckResult::Outcome::kFailed) failed += "\n  " + r.name + ": " + r.detail;
  }
  if (!failed.empty()) {
    throw std::runtime_error("ActiveKV device check failed on " + chosen->str() + ":" + failed);
  }
  return out;
}

}  // namespace
}  // namespace activekv

PYBIND11_MODULE(activekv, m) {
  using namespace activekv;
  m.doc() = "ActiveKV: vLLM's KV cache in host RAM. Load with kv_connector_module_path='activekv'.";
  py::class_<SchedulerEngine>(m, "_SchedulerEngine");
  // Read-only views of the host store, for the parity harness and tests.
  py::class_<WorkerSide>(m, "_WorkerEngine")
      .def("sealed_slots", [](WorkerSide& w) {
        return w.arena() != nullptr ? w.arena()->sealed_slots() : std::vector<std::int64_t>{};
      })
      .def("slot_data", [](WorkerSide& w, std::int64_t slot) {
        if (w.arena() == nullptr) throw py::value_error("KV caches not registered yet");
        auto data = w.arena()->slot_data(slot);
        if (!data.ok()) throw py::index_error(data.status().error());
        return py::bytes(data.value());
      })
      .def("streamed_layers", [](WorkerSide& w) {
        return w.streamer() != nullptr ? w.streamer()->geometry().streamed() : std::vector<std::string>{};
      })
      .def("streamed_home", [](WorkerSide& w, const std::string& name) {
        if (w.streamer() == nullptr) throw py::value_error("no streamed layers (streaming off or not registered)");
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
  m.def("vllm_features", [m] {
    make_vllm_classes(m);
    return g_classes->features.as_dict();
  }, "What the installed vLLM offers ActiveKV (its version, the patch series' hooks, the optional\n"
     "interfaces ActiveKV uses where present), as probed when the connector class was built.");
  m.def("register", [] {
    py::module_::import("vllm.distributed.kv_transfer.kv_connector.factory")
        .attr("KVConnectorFactory")
        .attr("register_connector")(kConnectorName, kModule, kConnectorName);
  }, "vllm.general_plugins entry point: makes 'ActiveKVConnector' known to vLLM by name.");

  // ---- the device check: the engine's device scenarios, for operators and the
  // release's GPU check of the shipped wheel (device_check.h) ----
  m.def("check_device", [](const py::object& device, bool quiet) { return check_device_from_python(device, quiet); },
        py::arg("device") = py::none(), py::kw_only(), py::arg("quiet") = false,
        "Run the engine's device scenarios on `device` (a str or torch.device; default: torch's current\n"
        "accelerator, else the CPU): a worker over real KV caches there saving and loading blocks, its\n"
        "save fences completing, a fence past its deadline quarantining its slots, and layer\n"
        "streaming's ring. Prints a line per scenario unless quiet; returns the results as dicts\n"
        "(name, outcome: passed/failed/skipped, detail, seconds); raises RuntimeError naming each\n"
        "failed scenario. Needs ~1.5 GiB of device and pinned host memory on an accelerator.");
}
