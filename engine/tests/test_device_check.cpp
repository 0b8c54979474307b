// The device scenarios (device_check.h) on CPU, and on the accelerator torch
// was built for when the machine has one: a worker side over real KV caches
// saving, loading, fencing, quarantining and streaming through its ring.
#include <ATen/DeviceAccelerator.h>
#include <gtest/gtest.h>

#include "activekv/device_check.h"

namespace activekv {
namespace {

using Outcome = CheckResult::Outcome;

std::vector<CheckResult> run_on(c10::Device device) {
  const auto results = check_device(device);
  EXPECT_EQ(results.size(), device_check_names().size());
  for (const auto& r : results) {
    EXPECT_NE(r.outcome, Outcome::kFailed) << r.name << " on " << device << ": " << r.detail;
  }
  return results;
}

TEST(DeviceCheck, EveryScenarioPassesOnCpuButTheFenceTimeoutsWhichCannotHappen) {
  for (const auto& r : run_on(c10::Device("cpu"))) {
    const bool a_fence_timeout =
        r.name == "fence-timeout-quarantines" || r.name == "streaming-fence-timeout-poisons";
    EXPECT_EQ(r.outcome == Outcome::kSkipped, a_fence_timeout) << r.name;
  }
}

TEST(DeviceCheck, RefusesADeviceThisTorchDoesNotHave) {
  const auto type = at::accelerator::getAccelerator(false);
  const c10::Device other(type == c10::DeviceType::CUDA ? c10::DeviceType::XPU : c10::DeviceType::CUDA, 0);
  EXPECT_THROW(check_device(other), std::invalid_argument);
}

TEST(DeviceCheckOnAccelerator, EveryScenarioPasses) {
  const auto type = at::accelerator::getAccelerator(false);
  if (!type || at::accelerator::deviceCount() == 0) {
    GTEST_SKIP() << "no accelerator in this torch build or machine";
  }
  for (const auto& r : run_on(c10::Device(*type, 0))) {
    EXPECT_EQ(r.outcome, Outcome::kPassed) << r.name << ": " << r.detail;
  }
}

}  // namespace
}  // namespace activekv
