#include "check_device.h"

#include <ATen/DeviceAccelerator.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "activekv/device_check.h"

namespace activekv::bindings {

using namespace pybind11::literals;

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

}  // namespace activekv::bindings
