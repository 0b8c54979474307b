// The module's exceptions, and an engine Status or Result raised as one.
//
// activekv.Error (a ValueError) is what ActiveKV refuses, one of two kinds:
// activekv.ConfigError, a configuration, its own kv_connector_extra_config or
// vLLM's settings, named with what to do; activekv.UnsupportedLayoutError, a
// KV cache it cannot serve. The reference engine raises the same classes by
// name.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <utility>

#include "activekv/status.h"

namespace activekv::bindings {

namespace py = pybind11;

void register_errors(py::module_& m);

[[noreturn]] void raise_config_error(const std::string& message);
[[noreturn]] void raise_layout_error(const std::string& message);

// `s`, not ok, as its Python exception: ConfigError, UnsupportedLayoutError,
// IndexError (out of range), KeyError (not found), MemoryError, or
// RuntimeError (a stale slot).
[[noreturn]] void raise_status(const Status& s);

inline void raise_if_failed(const Status& s) {
  if (!s.ok()) raise_status(s);
}

template <class T>
T value_or_raise(Result<T> r) {
  if (!r.ok()) raise_status(r.status());
  return std::move(r.value());
}

}  // namespace activekv::bindings
