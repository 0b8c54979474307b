// Attributes read on every step, by names made once: pybind11's attr("...")
// makes a new str on every call, and hasattr raises and clears an exception
// for a missing name.
#pragma once

#include <pybind11/pybind11.h>

namespace activekv::bindings {

namespace py = pybind11;

// An interned str. Never freed: it lives as long as the interpreter. Must be
// called with the GIL held.
inline PyObject* interned(const char* name) {
  PyObject* key = PyUnicode_InternFromString(name);
  if (key == nullptr) throw py::error_already_set();
  return key;
}

// obj.<key>, a key made by interned().
inline py::object get(const py::handle& obj, PyObject* key) {
  PyObject* value = PyObject_GetAttr(obj.ptr(), key);
  if (value == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(value);
}

}  // namespace activekv::bindings
