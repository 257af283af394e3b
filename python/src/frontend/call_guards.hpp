// CallGuards: when a call of a tuned ait.Module may skip its Python path (the torch front
// end's C++ half, torch_dispatch.cpp), and the small CPython helpers the dispatch shares.
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <vector>

namespace aitune::python {

namespace nb = nanobind;

// `name` as the interned string equal to it, so names compare by identity.
inline nb::object interned(nb::object name) {
  PyObject* object = name.release().ptr();
  PyUnicode_InternInPlace(&object);
  return nb::steal(object);
}

// str(value), for a message.
inline std::string text_of(nb::handle value) {
  nb::object text = nb::steal(PyObject_Str(value.ptr()));
  if (!text.is_valid()) throw nb::python_error();
  const char* utf8 = PyUnicode_AsUTF8(text.ptr());
  if (utf8 == nullptr) throw nb::python_error();
  return utf8;
}

// PyObject_IsTrue, with its error raised rather than read as true.
inline bool truthy(PyObject* value) {
  int result = PyObject_IsTrue(value);
  if (result < 0) throw nb::python_error();
  return result != 0;
}

// When a module call may skip its Python path: what nn.Module.__call__ checks before it
// goes straight to forward (hooks, a compiled call, JIT tracing), and what the front end's
// forward checks before it dispatches (no recording, not eager). All of it must be falsy.
struct CallGuards {
  std::vector<nb::object> global_dicts;   // process-wide hook registries
  std::vector<nb::object> context_vars;   // ContextVars
  std::vector<nb::object> calls;          // no-argument callables
  std::vector<nb::object> attributes;     // attribute names of the module (interned str)

  bool clear(PyObject* module) const {
    for (const auto& d : global_dicts)
      if (PyDict_GET_SIZE(d.ptr()) != 0) return false;
    for (const auto& var : context_vars) {
      PyObject* value = nullptr;
      if (PyContextVar_Get(var.ptr(), nullptr, &value) < 0) throw nb::python_error();
      nb::object held = nb::steal(value);
      if (value != nullptr && truthy(value)) return false;
    }
    for (const auto& call : calls) {
      nb::object value = nb::steal(PyObject_CallNoArgs(call.ptr()));
      if (!value.is_valid()) throw nb::python_error();
      if (truthy(value.ptr())) return false;
    }
    for (const auto& name : attributes) {
      nb::object value = nb::steal(PyObject_GetAttr(module, name.ptr()));
      if (!value.is_valid()) throw nb::python_error();
      if (truthy(value.ptr())) return false;
    }
    return true;
  }
};

}  // namespace aitune::python
