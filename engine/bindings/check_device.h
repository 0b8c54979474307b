// activekv.check_device: the core's device scenarios (device_check.h), for
// operators and the release's GPU check of the shipped wheel.
#pragma once

#include <pybind11/pybind11.h>

namespace activekv::bindings {

namespace py = pybind11;

// check_device(device=None, *, quiet=False): the core's scenarios, run with the
// GIL released; each result is printed as it comes (a check takes seconds).
py::list check_device_from_python(const py::object& device, bool quiet);

}  // namespace activekv::bindings
