// The engine's device scenarios, runnable on any device torch has: a worker
// side over real KV caches on that device saving and loading blocks bitwise,
// its save fences completing after their step (and only then the blocks being
// visible), a fence past its deadline quarantining its slots, and layer
// streaming's ring staging each layer's own bytes over many steps.
//
// One copy of these scenarios serves three callers: the C++ tests (on CPU,
// and on the accelerator where there is one), the Python module's
// check_device (an operator checks a host; the release checks the shipped
// wheel on a GPU machine), and nothing else re-states them.
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <string>
#include <vector>

namespace activekv {

struct CheckResult {
  enum class Outcome { kPassed, kFailed, kSkipped };
  std::string name;
  Outcome outcome = Outcome::kPassed;
  // What was checked (passed), what went wrong (failed), or why the scenario
  // does not apply to the device (skipped).
  std::string detail;
  double seconds = 0;
};

// "passed", "failed", "skipped".
const char* outcome_name(CheckResult::Outcome outcome);

// The scenarios' names, in the order check_device runs them.
std::vector<std::string> device_check_names();

// Runs every scenario on `device` (a device without an index means the
// current one) and returns their results in order; `on_result`, if given, is
// called after each. A scenario that fails (or throws) does not stop the
// others. On CPU, where copies are synchronous, the fence-timeout scenario is
// skipped. On an accelerator the fence scenarios move 1.5 GiB (enough to
// outlast a 1 ms deadline at any bus speed): that much device memory and
// pinned host memory must be free.
// Throws std::invalid_argument for a device this torch build or machine does
// not have.
std::vector<CheckResult> check_device(c10::Device device,
                                      const std::function<void(const CheckResult&)>& on_result = {});

}  // namespace activekv
