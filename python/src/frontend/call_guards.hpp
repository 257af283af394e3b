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

// The wrapped module's modules (itself first, then its submodules) as tuning left them:
// each one's train()/eval() mode and, for the submodules, the forward hooks registered on
// it. A graph keeps the mode it was exported in and runs no submodule, so a submodule put
// in another mode (Monte Carlo dropout: Dropout layers back in train()) or given a hook
// (feature extraction), or a hook the export ran removed, makes eager differ from the
// graph: such calls go to the Python path, which runs them eagerly. Read from each
// module's instance dict (`training`, `_forward_pre_hooks`, `_forward_hooks`): a few
// dict reads per module, no Python call. Hook handles' ids only grow, so a dict's size and
// its largest key tell whether its set of hooks changed.
class SubmoduleState {
 public:
  SubmoduleState() = default;

  // `modules`: the module and its submodules; `training`: the mode the graphs were
  // recorded in (None: modes not checked). The modes expected are the modules' current
  // ones where the module is in that mode (a submodule kept in another mode while tuning
  // stays expected so), else that mode for every module (a module just loaded, still in
  // the mode it was built in: ait.load then puts it in the tuned mode).
  void set(std::vector<nb::object> modules, nb::object training) {
    static PyObject* training_name = PyUnicode_InternFromString("training");
    static PyObject* names[2] = {PyUnicode_InternFromString("_forward_pre_hooks"),
                                 PyUnicode_InternFromString("_forward_hooks")};
    training_name_ = training_name;
    hook_names_[0] = names[0];
    hook_names_[1] = names[1];
    modules_.clear();
    for (auto& module : modules) {
      nb::object dict = nb::steal(PyObject_GenericGetDict(module.ptr(), nullptr));
      if (!dict.is_valid()) throw nb::python_error();
      modules_.push_back(Entry{std::move(module), std::move(dict), nullptr, {}});
    }
    snapshot(training);
  }

  // Takes the modules' hooks as they are now as expected (and the modes, as `set` does).
  void snapshot(nb::handle training) {
    PyObject* uniform = nullptr;
    if (!training.is_none()) {
      uniform = truthy(training.ptr()) ? Py_True : Py_False;
      PyObject* root = modules_.empty() ? nullptr : PyDict_GetItemWithError(modules_[0].dict.ptr(), training_name_);
      if (root == nullptr && PyErr_Occurred()) throw nb::python_error();
      bool keep_current = root != nullptr && (root == Py_True || root == Py_False) && root == uniform;
      for (auto& entry : modules_) {
        PyObject* current = PyDict_GetItemWithError(entry.dict.ptr(), training_name_);
        if (current == nullptr && PyErr_Occurred()) throw nb::python_error();
        entry.training = keep_current && (current == Py_True || current == Py_False) ? current : uniform;
      }
    } else {
      for (auto& entry : modules_) entry.training = nullptr;
    }
    for (std::size_t i = 1; i < modules_.size(); ++i)
      for (int h = 0; h < 2; ++h) modules_[i].hooks[h] = hooks_of(modules_[i].dict.ptr(), h);
  }

  bool clear() const {
    for (std::size_t i = 0; i < modules_.size(); ++i)
      if (changed(i) != nullptr) return false;
    return true;
  }

  // "mode" or "hooks" where module i differs from what tuning left, else nullptr.
  const char* changed(std::size_t i) const {
    const Entry& entry = modules_[i];
    if (entry.training != nullptr) {
      PyObject* current = PyDict_GetItemWithError(entry.dict.ptr(), training_name_);
      if (current == nullptr && PyErr_Occurred()) throw nb::python_error();
      if (current != entry.training) {
        // not the same object: True / False compared as Python compares them (training = 1)
        if (current == nullptr || truthy(current) != (entry.training == Py_True)) return "mode";
      }
    }
    if (i > 0)
      for (int h = 0; h < 2; ++h)
        if (hooks_of(entry.dict.ptr(), h) != entry.hooks[h]) return "hooks";
    return nullptr;
  }

  std::size_t size() const noexcept { return modules_.size(); }

  // For the cycle collector (tp_traverse): visits every object held; the first non-zero
  // result is returned.
  int traverse(visitproc visit, void* arg) const {
    for (const auto& entry : modules_) {
      Py_VISIT(entry.module.ptr());
      Py_VISIT(entry.dict.ptr());
    }
    return 0;
  }
  void reset() noexcept { modules_.clear(); }

 private:
  struct Hooks {
    Py_ssize_t size = 0;
    long long largest = -1;  // the largest handle id; -2: a dict missing or not a dict
    bool operator!=(const Hooks& other) const { return size != other.size || largest != other.largest; }
  };
  struct Entry {
    nb::object module;
    nb::object dict;       // the module's instance dict
    PyObject* training;    // Py_True / Py_False expected; nullptr: not checked
    Hooks hooks[2];        // _forward_pre_hooks, _forward_hooks as tuning left them
  };

  Hooks hooks_of(PyObject* dict, int which) const {
    PyObject* hooks = PyDict_GetItemWithError(dict, hook_names_[which]);
    if (hooks == nullptr && PyErr_Occurred()) throw nb::python_error();
    if (hooks == nullptr || !PyDict_Check(hooks)) return Hooks{0, -2};
    Hooks found{PyDict_GET_SIZE(hooks), -1};
    if (found.size == 0) return found;
    Py_ssize_t position = 0;
    PyObject* key = nullptr;
    PyObject* value = nullptr;
    while (PyDict_Next(hooks, &position, &key, &value)) {
      long long id = PyLong_Check(key) ? PyLong_AsLongLong(key) : -1;
      if (id == -1 && PyErr_Occurred()) PyErr_Clear();
      if (id > found.largest) found.largest = id;
    }
    return found;
  }

  std::vector<Entry> modules_;
  PyObject* training_name_ = nullptr;
  PyObject* hook_names_[2] = {nullptr, nullptr};
};

// When a module call may skip its Python path: what nn.Module.__call__ checks before it
// goes straight to forward (hooks, a compiled call, JIT tracing), and what the front end's
// forward checks before it dispatches (no recording, not eager). All of it must be falsy.
struct CallGuards {
  std::vector<nb::object> global_dicts;   // process-wide hook registries
  std::vector<nb::object> context_vars;   // ContextVars
  std::vector<nb::object> calls;          // no-argument callables
  std::vector<nb::object> attributes;     // attribute names of the module (interned str)
  SubmoduleState submodules;              // the wrapped module's modules' modes and hooks

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
    return submodules.clear();
  }
};

}  // namespace aitune::python
