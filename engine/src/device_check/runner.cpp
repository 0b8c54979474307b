#include "activekv/device_check.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>

#include "activekv/config.h"
#include "activekv/kv_codec.h"
#include "activekv/kv_layout.h"
#include "activekv/layer_streaming.h"
#include "activekv/step_plan.h"
#include "activekv/worker_side.h"

#include "scenarios.h"

namespace activekv {
namespace {

using device_check::Findings;
using namespace device_check;

// ---- the list -------------------------------------------------------------------

struct Scenario {
  const char* name;
  std::string (*run)(c10::Device, Findings&);
};

const std::vector<Scenario>& scenarios() {
  static const std::vector<Scenario> all = {
      {"save-load-exact", [](c10::Device d, Findings& f) { return save_load(d, Mode::kExact, f); }},
      {"save-load-compressed", [](c10::Device d, Findings& f) { return save_load(d, Mode::kCompressed, f); }},
      {"save-load-full-graph",
       [](c10::Device d, Findings& f) { return save_load(d, Mode::kExact, f, false, true); }},
      {"save-load-small-ring",
       [](c10::Device d, Findings& f) { return save_load(d, Mode::kExact, f, true, true); }},
      {"save-load-small-ring-compressed",
       [](c10::Device d, Findings& f) { return save_load(d, Mode::kCompressed, f, true, true); }},
      {"save-load-async",
       [](c10::Device d, Findings& f) { return save_load(d, Mode::kExact, f, true, true, true); }},
      {"save-load-async-compressed",
       [](c10::Device d, Findings& f) { return save_load(d, Mode::kCompressed, f, true, true, true); }},
      {"save-fences-complete", save_fences_complete},
      {"fence-timeout-quarantines", fence_timeout_quarantines},
      {"streaming-ring", [](c10::Device d, Findings& f) { return streaming_ring(d, f, Mode::kExact); }},
      {"streaming-ring-compressed",
       [](c10::Device d, Findings& f) { return streaming_ring(d, f, Mode::kCompressed); }},
      {"streaming-fence-timeout-poisons", streaming_fence_timeout_poisons},
      {"streaming-back-to-back",
       [](c10::Device d, Findings& f) { return streaming_back_to_back(d, f, Mode::kExact); }},
      {"streaming-back-to-back-compressed",
       [](c10::Device d, Findings& f) { return streaming_back_to_back(d, f, Mode::kCompressed); }},
      {"compressed-decode", compressed_decode},
  };
  return all;
}

// The device with its index, or std::invalid_argument naming what is missing.
c10::Device usable(c10::Device device) {
  if (device.is_cpu()) return device;
  const auto accelerator = at::accelerator::getAccelerator(false);
  if (!accelerator || *accelerator != device.type()) {
    throw std::invalid_argument("device " + device.str() + ": this torch build's accelerator is " +
                                (accelerator ? c10::DeviceTypeName(*accelerator, true) : "none"));
  }
  const auto count = at::accelerator::deviceCount();
  if (count == 0 || device.index() >= static_cast<c10::DeviceIndex>(count)) {
    throw std::invalid_argument("device " + device.str() + ": this machine has " + std::to_string(count) +
                                " device(s) of that type");
  }
  return device.has_index() ? device : c10::Device(device.type(), at::accelerator::getDeviceIndex());
}

}  // namespace

const char* outcome_name(CheckResult::Outcome outcome) {
  switch (outcome) {
    case CheckResult::Outcome::kPassed:
      return "passed";
    case CheckResult::Outcome::kFailed:
      return "failed";
    case CheckResult::Outcome::kSkipped:
      return "skipped";
  }
  return "?";
}

std::vector<std::string> device_check_names() {
  std::vector<std::string> names;
  for (const auto& s : scenarios()) names.emplace_back(s.name);
  return names;
}

std::vector<CheckResult> check_device(c10::Device device,
                                      const std::function<void(const CheckResult&)>& on_result) {
  device = usable(device);
  const c10::DeviceGuard guard(device);  // streams and events of the worker's device
  std::vector<CheckResult> results;
  for (const auto& scenario : scenarios()) {
    const auto started = std::chrono::steady_clock::now();
    Findings f;
    std::string checked;
    try {
      checked = scenario.run(device, f);
    } catch (const std::exception& e) {
      f.expect(false, std::string("threw: ") + e.what());
    }
    CheckResult r = f.result(scenario.name, checked);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (on_result) on_result(r);
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace activekv
