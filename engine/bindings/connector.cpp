#include "connector.h"

#include <ATen/core/Tensor.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "activekv/config.h"
#include "activekv/kv_layout.h"
#include "activekv/layer_streaming.h"
#include "activekv/scheduler_side.h"
#include "activekv/store_file.h"
#include "activekv/worker_side.h"
#include "attributes.h"
#include "convert.h"
#include "errors.h"
#include "metrics.h"
#include "scheduler_adapter.h"
#include "vllm_classes.h"
#include "vllm_facts.h"

namespace activekv::bindings {

using namespace pybind11::literals;

namespace {

// Where a connector instance keeps its side and its metadata.
struct ConnectorKeys {
  PyObject* scheduler = interned("_activekv_scheduler");
  PyObject* worker = interned("_activekv_worker");
  PyObject* metadata = interned("_connector_metadata");
};
const ConnectorKeys& connector_keys() {
  static const ConnectorKeys k;  // first used with the GIL held
  return k;
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
WorkerSide* find_worker(const py::handle& self) {
  return engine_in<WorkerSide>(self, connector_keys().worker);
}

SchedulerEngine& scheduler_of(const py::handle& self) {
  auto* engine = engine_in<SchedulerEngine>(self, connector_keys().scheduler);
  if (engine == nullptr)
    throw py::attribute_error("ActiveKV: a scheduler-side call on a worker-side connector");
  return *engine;
}
WorkerSide& worker_of(const py::handle& self) {
  WorkerSide* engine = find_worker(self);
  if (engine == nullptr)
    throw py::attribute_error("ActiveKV: a worker-side call on a scheduler-side connector");
  return *engine;
}
void set_metadata(const py::handle& self, const py::handle& meta) {
  if (PyObject_SetAttr(self.ptr(), connector_keys().metadata, meta.ptr()) != 0) throw py::error_already_set();
}

// Whether vLLM calls wait_for_layer_load and save_kv_layer this step: a full
// CUDA graph replays the whole model with no Python between layers (vLLM
// 0.26.0's GPU runner starts its loads with no attention metadata bound for
// it, the older runner marks the forward FULL), and a step without a forward
// has no metadata either. None: a caller making the per-layer calls itself.
bool layer_hooks_run(const py::handle& forward_context) {
  if (forward_context.is_none()) return true;
  if (py::getattr(forward_context, "attn_metadata", py::none()).is_none()) return false;
  const py::object mode = py::getattr(forward_context, "cudagraph_runtime_mode", py::none());
  return mode.is_none() || !py::hasattr(mode, "name") || py::cast<std::string>(mode.attr("name")) != "FULL";
}

// The store file's mapping page-locked for CUDA's copies (cudaHostRegister,
// through torch's own binding of the runtime): a load then crosses at the
// pinned rate, not the pageable one (17.8 against 55 GB/s on the H200).
// ATen has no device-neutral way to register memory it did not allocate, so
// other devices read it as pageable memory. Undone at shutdown, before the
// worker unmaps the file. Returns what start-up says.
constexpr const char* kPinnedStore = "_activekv_pinned_store";

std::string pin_store_file(const py::object& self, const StoreFile& file) {
  const py::object cudart = py::module_::import("torch").attr("cuda").attr("cudart")();
  const auto ptr = reinterpret_cast<std::uintptr_t>(file.data());
  const int err = py::cast<int>(py::int_(cudart.attr("cudaHostRegister")(ptr, file.data_bytes(), 0)));
  if (err != 0) {  // e.g. a disk file whose pages the kernel will not lock: still served, more slowly
    return "pageable (cudaHostRegister refused it: CUDA error " + std::to_string(err) + ")";
  }
  self.attr(kPinnedStore) = py::int_(ptr);
  return "pinned for the device (" + std::to_string(file.data_bytes() >> 20) + " MiB)";
}

void unpin_store_file(const py::object& self) {
  if (!py::hasattr(self, kPinnedStore)) return;
  const py::object ptr = self.attr(kPinnedStore);
  py::delattr(self, kPinnedStore);
  py::module_::import("torch").attr("cuda").attr("cudart")().attr("cudaHostUnregister")(ptr);
}

// vLLM 0.34's extensible KV cache (on by default on CUDA) commits to the KV
// cache, after warm-up, the device memory vLLM measured free; with
// gpu_memory_utilization unset it takes all of it (1.0). Streaming's ring
// regions live in that committed memory (one segment per region, every layer
// of a region on it), but the engine's loads and stagings go through device
// buffers of its own, which vLLM does not measure. And where vLLM captures
// breakable CUDA graphs (auto-enabled for some architectures since 0.34), the
// KV cache update op is captured with its layer's early wait, which streaming
// needs every step. Asynchronous loads before vLLM 0.32 (SchedulerOutput
// without has_sync_kv_loads) are unverified: vLLM 0.26's offline LLM drops the
// statistics of a step without request outputs (llm_engine.py; 0.32 records
// them), the step where a parked request's hit is counted, and that stopped
// their GPU test before it compared the tokens. Asked before vLLM sizes its
// cache and again by each connector; throws ValueError naming the setting to use.
void check_vllm_settings(const py::handle& vllm_config, const Config& config) {
  const py::object cache = py::getattr(vllm_config, "cache_config", py::none());
  if (g_classes->features.extensible_kv_cache &&
      py::getattr(cache, "enable_extensible_kv_cache", py::none()).is(py::bool_(true)) &&
      py::getattr(cache, "gpu_memory_utilization", py::none()).is_none()) {
    raise_config_error(
        "ActiveKV stages its loads through device buffers that vLLM's extensible KV cache (on by default "
        "on CUDA since vLLM 0.34) leaves no room for when gpu_memory_utilization is unset (it then takes "
        "1.0 of the device): set --gpu-memory-utilization, e.g. 0.9, or start vLLM with "
        "--no-enable-extensible-kv-cache");
  }
  if (config.async_load_min_tokens > 0 && !g_classes->features.sync_kv_loads_flag) {
    raise_config_error(
        "kv_connector_extra_config['async_load_min_tokens']=" + std::to_string(config.async_load_min_tokens) +
        " asks for asynchronous loads, which ActiveKV has verified on vLLM 0.32 and later; on this vLLM " +
        g_classes->features.version +
        " they are unverified, so refused: leave async_load_min_tokens at 0 "
        "(every hit loads inside its step)");
  }
  if (!config.streaming) return;
  const py::object compilation = py::getattr(vllm_config, "compilation_config", py::none());
  const py::object model = py::getattr(vllm_config, "model_config", py::none());
  const bool eager =
      !model.is_none() && py::getattr(model, "enforce_eager", py::bool_(false)).is(py::bool_(true));
  if (!eager && py::getattr(compilation, "use_breakable_cudagraph", py::none()).is(py::bool_(true))) {
    raise_config_error(
        "ActiveKV layer streaming needs each layer's KV cache update to run outside CUDA graphs, which "
        "vLLM's breakable CUDA graphs capture: start vLLM with VLLM_USE_BREAKABLE_CUDAGRAPH=0 in its "
        "environment (or --enforce-eager)");
  }
}

void connector_init(py::object self, py::object vllm_config, py::object role, py::object kv_cache_config) {
  g_classes->base.attr("__init__")(self, vllm_config, role, kv_cache_config);
  const py::object transfer = self.attr("_kv_transfer_config");
  const Config config = parse_config(transfer.attr("kv_connector_extra_config"));
  check_vllm_settings(vllm_config, config);
  const KVLayout layout = layout_of(kv_cache_config);
  const std::int64_t slot_bytes = layout.slot_bytes(config.mode);
  const HostMemory host = usable_host_memory();
  const std::int64_t num_slots = value_or_raise(config.store_slots(slot_bytes, host));
  const bool scheduler = role.is(g_classes->scheduler_role);
  std::optional<StreamingGeometry> geometry;
  std::optional<StartupReport> report;
  const auto num_blocks = py::cast<std::int64_t>(kv_cache_config.attr("num_blocks"));
  if (config.streaming) {
    if (!g_classes->features.streaming_hooks) {
      raise_config_error(
          "ActiveKV layer streaming needs vLLM with ActiveKV's patch series (patches/vllm/" +
          g_classes->features.version + "/0002: KVConnectorBase_V1.get_kv_cache_regions); this vLLM " +
          g_classes->features.version +
          " is not patched: install the patched wheel "
          "(python3 ci/run-nox -s patch-vllm) or remove 'streaming' from kv_connector_extra_config");
    }
    geometry = streaming_geometry(*config.streaming, vllm_config, kv_cache_config.attr("kv_cache_groups"));
    report =
        StartupReport::of(*geometry, num_blocks, layout.block_size, layout.layer_bytes(geometry->homes),
                          py::cast<std::int64_t>(vllm_config.attr("model_config").attr("max_model_len")));
    raise_if_failed(report->check_host_memory(config.capacity_bytes, host));
    if (scheduler) {
      // Under vLLM's logger: its handlers print it, as they do vLLM's own start-up lines.
      py::module_::import("logging").attr("getLogger")("vllm.activekv").attr("info")("%s", report->line());
    }
  }
  const ModelIdentity id{
      py::cast<std::string>(py::str(vllm_config.attr("model_config").attr("model"))),
      dtype_name(layout.dtype),
      static_cast<std::int64_t>(layout.layer_names.size()),
      layout.num_kv_heads,
      layout.head_size,
      layout.block_size,
      py::cast<std::int64_t>(vllm_config.attr("parallel_config").attr("tensor_parallel_size"))};
  if (scheduler) {
    auto side = std::make_unique<SchedulerSide>(
        config, id.digest(), layout.block_size, slot_bytes, num_slots, id.tp_size,
        geometry ? std::optional<std::int64_t>(num_blocks) : std::nullopt);
    if (report) side->report_streaming(*report);
    // vLLM makes the scheduler's connector after its workers registered their
    // KV caches, so every rank's store file is open and verified by now.
    const auto restored = side->restore_from_store_files();
    raise_if_failed(restored.status());
    if (!restored.value().empty()) {
      py::module_::import("logging").attr("getLogger")("vllm.activekv").attr("info")("%s", restored.value());
    }
    self.attr("_activekv_scheduler") = py::cast(SchedulerEngine(std::move(side)));
  } else {
    const auto rank = py::cast<std::int64_t>(
        py::module_::import("vllm.distributed.parallel_state").attr("get_tensor_model_parallel_rank")());
    auto worker = std::make_unique<WorkerSide>(config, layout, num_slots, rank, std::move(geometry));
    // Tensor x pipeline parallel (vLLM's world_size; tensor parallel where a
    // config has no world_size), times the data-parallel ranks on this host.
    const py::object parallel = vllm_config.attr("parallel_config");
    worker->set_workers(
        py::cast<std::int64_t>(py::getattr(parallel, "world_size", py::int_(id.tp_size))) *
        py::cast<std::int64_t>(py::getattr(parallel, "data_parallel_size_local", py::int_(1))));
    if (!config.store_path.empty()) {
      worker->use_store_file(store_file_of_rank(config.store_path, rank, id.tp_size),
                             store_file_identity(id, config.mode, rank));
    }
    self.attr("_activekv_worker") = py::cast(std::move(worker));
  }
}

// The worker's set-up and tear-down: its KV caches registered, the store
// file's pinning undone.
void add_worker_lifetime_methods(py::dict& ns) {
  ns["register_kv_caches"] = named("register_kv_caches", [](py::object self, py::dict kv_caches) {
    std::unordered_map<std::string, at::Tensor> caches;
    for (const auto& [k, v] : kv_caches) caches.emplace(py::cast<std::string>(k), py::cast<at::Tensor>(v));
    WorkerSide& worker = worker_of(self);
    raise_if_failed(worker.register_kv_caches(caches));
    if (const std::string line = worker.load_staging_line(); !line.empty()) {
      py::module_::import("logging").attr("getLogger")("vllm.activekv").attr("info")("%s", line);
    }
    if (const std::string line = worker.streaming_copies_line(); !line.empty()) {
      py::module_::import("logging").attr("getLogger")("vllm.activekv").attr("info")("%s", line);
    }
    if (const std::string line = worker.store_file_line(); !line.empty()) {
      const bool on_cuda = !caches.empty() && caches.begin()->second.is_cuda();
      py::module_::import("logging")
          .attr("getLogger")("vllm.activekv")
          .attr("info")("%s; %s", line,
                        on_cuda ? pin_store_file(self, *worker.store_file()) : std::string("pageable"));
    }
  });
  ns["shutdown"] = named("shutdown", [](py::object self) { unpin_store_file(self); });
}

// The worker's side of a forward: the step's plan bound, its loads and saves
// around every layer.
void add_worker_step_methods(py::dict& ns) {
  ns["bind_connector_metadata"] = named("bind_connector_metadata", [](py::object self, py::object meta) {
    set_metadata(self, meta);
    if (WorkerSide* w = find_worker(self)) w->bind_plan(plan_from_python(meta));
  });
  ns["clear_connector_metadata"] = named("clear_connector_metadata", [](py::object self) {
    set_metadata(self, py::none());
    if (WorkerSide* w = find_worker(self)) w->clear_plan();
  });
  ns["start_load_kv"] = named("start_load_kv", [](py::object self, py::object forward_context, py::kwargs) {
    WorkerSide& w = worker_of(self);
    if (!w.loads_this_step() && !w.async_loads_this_step() && !w.streams_this_step()) return;
    const bool hooks = layer_hooks_run(forward_context);
    py::gil_scoped_release nogil;
    w.start_load(hooks);
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
    if (!w.layer_waits_this_step()) return;
    const auto name = py::cast<std::string>(layer);
    py::gil_scoped_release nogil;
    w.wait_for_layer_load(name);
  });
  ns["save_kv_layer"] =
      named("save_kv_layer", [](py::object self, py::str layer, py::handle kv, py::object, py::kwargs) {
        WorkerSide& w = worker_of(self);
        if (!w.saves_this_step() && !w.streams_this_step()) return;
        const auto name = py::cast<std::string>(layer);
        const auto tensor = py::cast<at::Tensor>(kv);
        py::gil_scoped_release nogil;
        w.save_layer(name, tensor);
      });
  ns["wait_for_save"] = named("wait_for_save", [](py::object self) {
    WorkerSide& w = worker_of(self);
    if (!w.saves_this_step()) return w.wait_for_save();  // no copy to wait for
    py::gil_scoped_release nogil;
    w.wait_for_save();
  });
}

// What the worker tells the scheduler after a step: finished saves, failed
// loads, its report and its telemetry.
void add_worker_report_methods(py::dict& ns) {
  ns["get_finished"] = named("get_finished", [](py::object self, py::object finished) -> py::tuple {
    WorkerSide& w = worker_of(self);
    if (w.nothing_awaiting() && py::len(finished) == 0) return py::make_tuple(py::none(), py::none());
    const auto ids = py::cast<std::vector<std::string>>(py::list(finished));
    std::vector<std::string> done, landed;
    {
      py::gil_scoped_release nogil;
      done = w.get_finished(ids);
      landed = w.take_landed_requests();
    }
    const auto set_or_none = [](const std::vector<std::string>& v) {
      return v.empty() ? py::none() : py::object(py::set(py::cast(v)));
    };
    return py::make_tuple(set_or_none(done), set_or_none(landed));
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
    // Each worker is a source of its own (its gauges add up over the ranks).
    if (WorkerSide* w = find_worker(self)) {
      return stats_or_none(w->take_telemetry(), "worker" + std::to_string(w->tp_rank()));
    }
    return stats_or_none(scheduler_of(self).take_telemetry(), "scheduler");
  });
}

// The scheduler's side: hits, allocation, the step's plan, finished requests.
void add_scheduler_methods(py::dict& ns) {
  ns["get_num_new_matched_tokens"] =
      named("get_num_new_matched_tokens", [](py::object self, py::object request, std::int64_t n) {
        return scheduler_of(self).get_num_new_matched_tokens(request, n);
      });
  // vLLM 0.34, with --max-num-inflight-kv-loads: a request that may load
  // asynchronously waits in a queue of its own and may start loading while
  // the running batch is full.
  ns["may_load_async"] = named("may_load_async", [](py::object self, py::object request) {
    return scheduler_of(self).may_load_async(request);
  });
  ns["update_state_after_alloc"] = named(
      "update_state_after_alloc", [](py::object self, py::object request, py::object blocks, std::int64_t n) {
        scheduler_of(self).update_state_after_alloc(request, blocks, n);
      });
  ns["build_connector_meta"] = named("build_connector_meta", [](py::object self, py::object so) {
    const StepPlan plan = scheduler_of(self).build(so);
    // vLLM 0.34's model runner starts the loads before the forward only on a
    // step the scheduler marks (a request newly scheduled with host tokens);
    // others it starts after the forward. A step that stages streamed layers
    // or loads into blocks its attention reads must start first, as vLLM's
    // own HiSparse connector marks its steps.
    if (g_classes->features.sync_kv_loads_flag &&
        (!plan.loads.empty() || !plan.stage_blocks.empty() || !plan.writeback_blocks.empty())) {
      so.attr("has_sync_kv_loads") = true;
    }
    return plan_to_python(plan);
  });
  ns["update_connector_output"] = named("update_connector_output", [](py::object self, py::object output) {
    const py::object wm = output.attr("kv_connector_worker_meta");
    if (py::isinstance(wm, g_classes->worker_meta)) scheduler_of(self).apply(report_from_python(wm));
  });
  ns["request_finished"] = named("request_finished", [](py::object self, py::object request, py::object) {
    return py::make_tuple(scheduler_of(self).request_finished(request), py::none());
  });
  ns["has_pending_push_work"] = named("has_pending_push_work", [](py::object self) {
    const auto* s = engine_in<SchedulerEngine>(self, connector_keys().scheduler);
    return s != nullptr && s->has_pending_work();
  });
}

// What vLLM asks of the class before any instance exists: telemetry, the
// layout, the regions, the modes it refuses.
void add_class_methods(py::dict& ns) {
  const py::object classmethod = py::module_::import("builtins").attr("classmethod");
  // A copy of the payload, as the reference's dict(data): vLLM's log line
  // aggregates into the first stats it built, and the payload stays as sent.
  ns["build_kv_connector_stats"] =
      classmethod(named("build_kv_connector_stats", [](py::object, py::object data) {
        py::dict copy;
        if (!data.is_none()) {
          for (const auto& [k, v] : py::dict(data)) copy[k] = v;
        }
        return g_classes->stats("data"_a = copy);
      }));
  // A full CUDA graph replays with no per-layer hook. The store's loads and
  // saves then run at the step's edges (start_load_kv, wait_for_save), but
  // layer streaming stages and writes back each layer between the graph
  // pieces: with it, vLLM downgrades FULL_AND_PIECEWISE to PIECEWISE.
  ns["requires_piecewise_for_cudagraph"] =
      classmethod(named("requires_piecewise_for_cudagraph", [](py::object, py::object extra_config) {
        auto parsed = Config::parse(to_config_values(extra_config));
        return parsed.ok() && parsed.value().streaming.has_value();
      }));
  // Layer streaming stages whole blocks with one copy per run (or a device
  // gather of whole rows): it asks for the layout whose per-layer view keeps
  // each block one contiguous row in the logical order (HND on CUDA's flash
  // attention). Other modes take vLLM's default. A config that does not parse
  // is refused by the connector's constructor, with its message.
  ns["get_required_kvcache_layout"] =
      classmethod(named("get_required_kvcache_layout", [](py::object, py::object vllm_config) -> py::object {
        const py::object transfer = vllm_config.attr("kv_transfer_config");
        if (transfer.is_none()) return py::none();
        auto parsed = Config::parse(to_config_values(transfer.attr("kv_connector_extra_config")));
        if (!parsed.ok()) return py::none();
        // vLLM asks this before sizing its KV cache: refuse there, not after warm-up.
        check_vllm_settings(vllm_config, parsed.value());
        if (!parsed.value().streaming) return py::none();
        return py::str("HND");
      }));
  // Called by vLLM's engine core at start-up (patch 0002), before any
  // connector instance exists: the regions of the device KV cache, or None.
  ns["get_kv_cache_regions"] = classmethod(
      named("get_kv_cache_regions",
            [](py::object, py::object vllm_config, py::object kv_cache_groups) -> py::object {
              const Config config =
                  parse_config(vllm_config.attr("kv_transfer_config").attr("kv_connector_extra_config"));
              if (!config.streaming) return py::none();
              return py::cast(streaming_geometry(*config.streaming, vllm_config, kv_cache_groups).regions());
            }));
  // Sleep mode (vLLM 0.33+) frees and remaps the device KV cache under the
  // connector; ActiveKV's worker keeps views of it and copies in flight, so
  // vLLM refuses the combination at start-up, naming the connector.
  ns["supports_sleep_mode"] =
      classmethod(named("supports_sleep_mode", [](py::object, py::object) { return false; }));
  ns["build_prom_metrics"] =
      classmethod(named("build_prom_metrics", [](py::object, py::object vllm_config, py::object types,
                                                 py::object labels, py::object per_engine) {
        return g_classes->prom(vllm_config, types, labels, per_engine);
      }));
}

}  // namespace

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
  ns["requires_kv_delivery"] = py::module_::import("builtins").attr("property")(method([](py::object) {
    return false;
  }));  // a dropped save is only a future miss
  add_worker_lifetime_methods(ns);
  add_worker_step_methods(ns);
  add_worker_report_methods(ns);
  add_scheduler_methods(ns);
  add_class_methods(ns);
  return ns;
}

}  // namespace activekv::bindings
