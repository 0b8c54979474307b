#include "scheduler_adapter.h"

#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "attributes.h"

namespace activekv::bindings {
namespace {

// vLLM's SchedulerOutput, read on every step.
struct SchedulerOutputKeys {
  PyObject* num_scheduled_tokens = interned("num_scheduled_tokens");
  PyObject* scheduled_new_reqs = interned("scheduled_new_reqs");
  PyObject* scheduled_cached_reqs = interned("scheduled_cached_reqs");
  PyObject* req_ids = interned("req_ids");
  PyObject* resumed_req_ids = interned("resumed_req_ids");
  PyObject* new_block_ids = interned("new_block_ids");
  PyObject* num_computed_tokens = interned("num_computed_tokens");
};
const SchedulerOutputKeys& keys() {
  static const SchedulerOutputKeys k;  // first used with the GIL held
  return k;
}

}  // namespace

void SchedulerEngine::sync(const py::handle& request) {
  const std::string id = py::cast<std::string>(request.attr("request_id"));
  const std::int64_t known = side_->known_tokens(id);
  const py::object all = request.attr("all_token_ids");
  if (known == 0) requests_[py::str(id)] = request;
  if (py::len(all) <= static_cast<std::size_t>(known)) return;
  const auto fresh =
      py::cast<std::vector<std::int64_t>>(all[py::slice(known, static_cast<py::ssize_t>(py::len(all)), 1)]);
  const py::object salt = request.attr("cache_salt");
  side_->observe_request(id, salt.is_none() ? std::nullopt : std::optional(py::cast<std::string>(salt)),
                         py::cast<std::int64_t>(request.attr("num_prompt_tokens")), fresh);
}

py::tuple SchedulerEngine::get_num_new_matched_tokens(const py::handle& request, std::int64_t num_computed) {
  sync(request);
  const std::string id = py::cast<std::string>(request.attr("request_id"));
  std::int64_t n;
  bool load_async;
  {
    py::gil_scoped_release nogil;
    n = side_->get_num_new_matched_tokens(id, num_computed);
    load_async = side_->loads_async(id);
  }
  return py::make_tuple(n, load_async);
}

void SchedulerEngine::update_state_after_alloc(const py::handle& request, const py::handle& blocks,
                                               std::int64_t n) {
  const std::string id = py::cast<std::string>(request.attr("request_id"));
  std::vector<std::int64_t> ids;
  if (n > 0) ids = py::cast<std::vector<std::int64_t>>(blocks.attr("get_block_ids")()[py::int_(0)]);
  py::gil_scoped_release nogil;
  side_->update_state_after_alloc(id, ids, n);
}

StepPlan SchedulerEngine::build(const py::handle& so) {
  const SchedulerOutputKeys& k = keys();
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
  // Requests resumed after preemption: vLLM 0.34 has no such list (it sends
  // them again as new requests, with their whole block list).
  py::object resumed = py::tuple();
  if (PyObject* r = PyObject_GetAttr(cached.ptr(), k.resumed_req_ids)) {
    resumed = py::reinterpret_steal<py::object>(r);
  } else if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
    PyErr_Clear();
  } else {
    throw py::error_already_set();
  }
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

void SchedulerEngine::apply(const WorkerReport& report) {
  py::gil_scoped_release nogil;
  side_->apply_report(report);
}

bool SchedulerEngine::request_finished(const py::handle& request) {
  const auto id = py::cast<std::string>(request.attr("request_id"));
  const py::str key(id);
  if (known_request(key) && PyDict_DelItem(requests_.ptr(), key.ptr()) != 0) throw py::error_already_set();
  py::gil_scoped_release nogil;
  return side_->request_finished(id);
}

py::handle SchedulerEngine::known_request(const py::handle& id) const {
  PyObject* request = PyDict_GetItemWithError(requests_.ptr(), id.ptr());
  if (request == nullptr && PyErr_Occurred()) throw py::error_already_set();
  return request;
}

}  // namespace activekv::bindings
