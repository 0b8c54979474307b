// The scheduler side as a connector instance holds it: reads vLLM's requests
// and SchedulerOutput under the GIL, then runs the native SchedulerSide with
// the GIL released.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "activekv/scheduler_side.h"
#include "activekv/step_plan.h"
#include "activekv/telemetry.h"

namespace activekv::bindings {

namespace py = pybind11;

class SchedulerEngine {
 public:
  SchedulerEngine(std::unique_ptr<SchedulerSide> side) : side_(std::move(side)) {}

  // Brings the engine's copy of the request's token ids up to date.
  void sync(const py::handle& request);
  py::tuple get_num_new_matched_tokens(const py::handle& request, std::int64_t num_computed);
  void update_state_after_alloc(const py::handle& request, const py::handle& blocks, std::int64_t n);
  // The step's plan, from vLLM's SchedulerOutput.
  StepPlan build(const py::handle& so);
  void apply(const WorkerReport& report);
  bool request_finished(const py::handle& request);

  bool may_load_async(const py::handle& request) const {
    return side_->may_load_async(py::cast<std::int64_t>(request.attr("num_prompt_tokens")));
  }
  bool has_pending_work() const { return side_->has_pending_work(); }
  Telemetry take_telemetry() { return side_->take_telemetry(); }

 private:
  // The vLLM request of this id, or a null handle (borrowed from requests_).
  py::handle known_request(const py::handle& id) const;

  std::unique_ptr<SchedulerSide> side_;
  py::dict requests_;  // request id -> vllm Request, for its growing token ids
};

}  // namespace activekv::bindings
