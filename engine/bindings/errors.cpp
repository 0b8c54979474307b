#include "errors.h"

namespace activekv::bindings {

namespace {

// py::exception's tags: the classes are raised from Status, not by translating C++ exceptions.
struct ErrorTag {};
struct ConfigErrorTag {};
struct UnsupportedLayoutErrorTag {};

// Set once at import; the module (and so its classes) lives as long as the interpreter.
PyObject* g_config_error = nullptr;
PyObject* g_unsupported_layout_error = nullptr;

[[noreturn]] void raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

}  // namespace

void register_errors(py::module_& m) {
  const py::handle error = py::exception<ErrorTag>(m, "Error", PyExc_ValueError);
  g_config_error = py::exception<ConfigErrorTag>(m, "ConfigError", error).ptr();
  g_unsupported_layout_error =
      py::exception<UnsupportedLayoutErrorTag>(m, "UnsupportedLayoutError", error).ptr();
  m.attr("Error").attr("__doc__") =
      "What ActiveKV refuses: ConfigError or UnsupportedLayoutError (a ValueError; catch this one for both).";
  m.attr("ConfigError").attr("__doc__") =
      "A configuration ActiveKV refuses: its kv_connector_extra_config or vLLM's settings.";
  m.attr("UnsupportedLayoutError").attr("__doc__") = "A KV cache layout ActiveKV cannot serve.";
}

void raise_config_error(const std::string& message) { raise(g_config_error, message); }

void raise_layout_error(const std::string& message) { raise(g_unsupported_layout_error, message); }

void raise_status(const Status& s) {
  switch (s.error_code()) {
    case ErrorCode::kInvalidConfig:
      raise_config_error(s.error());
    case ErrorCode::kUnsupportedLayout:
      raise_layout_error(s.error());
    case ErrorCode::kOutOfRange:
      raise(PyExc_IndexError, s.error());
    case ErrorCode::kNotFound:
      raise(PyExc_KeyError, s.error());
    case ErrorCode::kOutOfMemory:
      raise(PyExc_MemoryError, s.error());
    case ErrorCode::kStale:
    case ErrorCode::kOk:
      break;
  }
  raise(PyExc_RuntimeError, s.error());
}

}  // namespace activekv::bindings
