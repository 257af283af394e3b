// CallGuards: when a call of a tuned ait.Module may skip its Python path (the torch front
// end's C++ half, torch_dispatch.cpp), and the small CPython helpers the dispatch shares.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
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
// graph: such calls go to the Python path, which runs them eagerly.
// Per call (`clear`): each module's `training` from its instance dict, the sizes of its
// hook dicts (held), and torch's hook handle counter (RemovableHandle.next_id, which
// every registration anywhere advances): a dict read per module and two size reads, no
// Python call. `changed` (the Python path) is exact: the hook dicts read again from the
// instance dict, their sizes and largest handle ids (ids only grow, so these tell whether
// the set of hooks changed). Each module's class and instance `forward` are compared by
// identity too (a pointer compare and one more dict read per module).
class SubmoduleState {
 public:
  SubmoduleState() = default;

  // `modules`: the module and its submodules; `training`: the mode the graphs were
  // recorded in (None: modes not checked); `counter`: an object whose `next_id` is torch's
  // hook handle counter (torch.utils.hooks.RemovableHandle; None: not read). The modes
  // expected are the modules' current ones where the module is in that mode (a submodule
  // kept in another mode while tuning stays expected so), else that mode for every module
  // (a module just loaded, still in the mode it was built in: ait.load then puts it in the
  // tuned mode).
  void set(std::vector<nb::object> modules, nb::object training, nb::object counter) {
    training_name_ = PyUnicode_InternFromString("training");
    forward_name_ = PyUnicode_InternFromString("forward");
    hook_names_[0] = PyUnicode_InternFromString("_forward_pre_hooks");
    hook_names_[1] = PyUnicode_InternFromString("_forward_hooks");
    next_id_name_ = PyUnicode_InternFromString("next_id");
    counter_ = std::move(counter);
    modules_.clear();
    for (auto& module : modules) {
      nb::object dict = nb::steal(PyObject_GenericGetDict(module.ptr(), nullptr));
      if (!dict.is_valid()) throw nb::python_error();
      modules_.push_back(Entry{std::move(module), std::move(dict), nullptr, {}, {}, nullptr, {}});
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
      bool keep_current = root != nullptr && root == uniform;
      for (auto& entry : modules_) {
        PyObject* current = PyDict_GetItemWithError(entry.dict.ptr(), training_name_);
        if (current == nullptr && PyErr_Occurred()) throw nb::python_error();
        entry.training = keep_current && (current == Py_True || current == Py_False) ? current : uniform;
      }
    } else {
      for (auto& entry : modules_) entry.training = nullptr;
    }
    for (auto& entry : modules_) {
      entry.type = Py_TYPE(entry.module.ptr());
      PyObject* class_forward = _PyType_Lookup(entry.type, forward_name_);  // borrowed, through the MRO
      entry.class_forward = class_forward != nullptr ? nb::borrow(class_forward) : nb::object();
      // The lookup gave the type a version tag (CPython's method cache), which any
      // assignment to the class or a base invalidates: a method or value patched on the
      // class (`Block.activation = ...`) is seen per call by one comparison.
      entry.version_tag = entry.type->tp_version_tag;
      PyObject* forward = PyDict_GetItemWithError(entry.dict.ptr(), forward_name_);
      if (forward == nullptr && PyErr_Occurred()) throw nb::python_error();
      entry.forward = forward != nullptr ? nb::borrow(forward) : nb::object();
    }
    for (std::size_t i = 1; i < modules_.size(); ++i)
      for (int h = 0; h < 2; ++h) {
        Entry& entry = modules_[i];
        PyObject* hooks = PyDict_GetItemWithError(entry.dict.ptr(), hook_names_[h]);
        if (hooks == nullptr && PyErr_Occurred()) throw nb::python_error();
        entry.hook_dicts[h] = hooks != nullptr && PyDict_Check(hooks) ? nb::borrow(hooks) : nb::object();
        entry.hooks[h] = hooks_of(entry.dict.ptr(), h);
      }
    next_id_ = counter_value();
  }

  bool clear() const {
    if (counter_.is_valid() && counter_value() != next_id_) return false;
    for (std::size_t i = 0; i < modules_.size(); ++i) {
      const Entry& entry = modules_[i];
      if (entry.training != nullptr) {
        PyObject* current = PyDict_GetItemWithError(entry.dict.ptr(), training_name_);
        if (current != entry.training) {
          if (current == nullptr && PyErr_Occurred()) throw nb::python_error();
          return false;  // another mode, or not True / False (the Python path compares it as Python does)
        }
      }
      if (patched(i)) return false;
      for (int h = 0; h < 2; ++h)
        if (entry.hook_dicts[h].is_valid() && PyDict_GET_SIZE(entry.hook_dicts[h].ptr()) != entry.hooks[h].size)
          return false;
    }
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
    if (const char* what = patched(i)) return what;
    if (i > 0)
      for (int h = 0; h < 2; ++h)
        if (hooks_of(entry.dict.ptr(), h) != entry.hooks[h]) return "hooks";
    return nullptr;
  }

  // After `changed` found nothing for any module: the handle counter moved for hooks
  // elsewhere (another module, other kinds of hooks); calls may skip Python again.
  void counter_seen() { next_id_ = counter_value(); }

  std::size_t size() const noexcept { return modules_.size(); }

  // For the cycle collector (tp_traverse): visits every object held; the first non-zero
  // result is returned.
  int traverse(visitproc visit, void* arg) const {
    Py_VISIT(counter_.ptr());
    for (const auto& entry : modules_) {
      Py_VISIT(entry.module.ptr());
      Py_VISIT(entry.dict.ptr());
      Py_VISIT(entry.hook_dicts[0].ptr());
      Py_VISIT(entry.hook_dicts[1].ptr());
      Py_VISIT(entry.forward.ptr());
      Py_VISIT(entry.class_forward.ptr());
    }
    return 0;
  }
  void reset() noexcept {
    modules_.clear();
    counter_ = nb::object();
  }

 private:
  struct Hooks {
    Py_ssize_t size = 0;
    long long largest = -1;  // the largest handle id; -2: a dict missing or not a dict
    bool operator!=(const Hooks& other) const { return size != other.size || largest != other.largest; }
  };
  struct Entry {
    nb::object module;
    nb::object dict;           // the module's instance dict
    PyObject* training;        // Py_True / Py_False expected; nullptr: not checked
    Hooks hooks[2];            // _forward_pre_hooks, _forward_hooks as tuning left them
    nb::object hook_dicts[2];  // those dicts (none for the wrapped module: the proxy runs its hooks)
    // The class and (submodules) the `forward` kept in the instance dict (none: the
    // class's) as tuning left them: adapter libraries patch `module.forward = ...` on a
    // submodule's instance, and `module.__class__ = Other` swaps every method; forward then
    // computes another model. (The wrapped module's own `forward` is what a call that runs
    // eagerly runs, replaced or not: tests replace it to see that the graph serves.)
    PyTypeObject* type;
    unsigned int version_tag = 0;  // type->tp_version_tag as tuning left it
    nb::object forward;
    // The `forward` the class gives (through its MRO) as tuning left it: a patch of the
    // class (`torch.nn.GELU.forward = ...`) changes every instance's computation.
    nb::object class_forward;
  };

  // "class", "class forward", "class attributes" or "forward" where module i's class, its
  // class's `forward`, any attribute of its class or bases (the Python path tells whether
  // one forward reads changed) or (a submodule's) instance `forward` is not the one tuning
  // left, else nullptr: what
  // `clear` and `changed` both ask.
  const char* patched(std::size_t i) const {
    const Entry& entry = modules_[i];
    if (Py_TYPE(entry.module.ptr()) != entry.type) return "class";
    if (_PyType_Lookup(entry.type, forward_name_) != entry.class_forward.ptr()) return "class forward";
    // (after the lookup above, which assigns a tag where an assignment cleared it)
    if (entry.type->tp_version_tag != entry.version_tag) return "class attributes";
    if (i == 0) return nullptr;
    PyObject* forward = PyDict_GetItemWithError(entry.dict.ptr(), forward_name_);
    if (forward == nullptr && PyErr_Occurred()) throw nb::python_error();
    return forward != entry.forward.ptr() ? "forward" : nullptr;
  }

  long long counter_value() const {
    if (!counter_.is_valid() || counter_.is_none()) return -1;
    nb::object value = nb::steal(PyObject_GetAttr(counter_.ptr(), next_id_name_));
    if (!value.is_valid()) throw nb::python_error();
    long long id = PyLong_AsLongLong(value.ptr());
    if (id == -1 && PyErr_Occurred()) throw nb::python_error();
    return id;
  }

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
  nb::object counter_;
  long long next_id_ = -1;
  PyObject* training_name_ = nullptr;
  PyObject* forward_name_ = nullptr;
  PyObject* hook_names_[2] = {nullptr, nullptr};
  PyObject* next_id_name_ = nullptr;
};

// The parameters and buffers of the wrapped module that tuned graphs hold copies of (an
// ONNX model's initializers), with their autograd version counters as tuning left them.
// An in-place write (an optimizer step, `with torch.no_grad(): w.mul_(2)`, copy_) moves a
// tensor's counter; the graphs would then compute the old model, so such a call goes to
// the Python path, which says so and runs the module eagerly. Per call: one read of
// `_version` per tensor, ~160 ns each on a 2-core host (through detached tensors; a
// Parameter's read cost twice that, docs/onnxruntime-backend.md). A write into `.data`
// moves no counter: not seen.
class WeightVersions {
 public:
  void set(std::vector<nb::object> tensors) {
    if (version_name_ == nullptr) version_name_ = PyUnicode_InternFromString("_version");
    entries_.clear();
    for (auto& t : tensors) {
      Entry entry{std::move(t), nullptr, nullptr, 0};
      // torch's `_version` is a getset descriptor of its tensor base type: its getter is
      // called directly, skipping the attribute lookup per read (its saving alone was not
      // measured: most of a read is torch's getter itself). Anything else: PyObject_GetAttr.
      PyObject* descr = _PyType_Lookup(Py_TYPE(entry.tensor.ptr()), version_name_);
      if (descr != nullptr && Py_IS_TYPE(descr, &PyGetSetDescr_Type)) {
        PyGetSetDef* def = reinterpret_cast<PyGetSetDescrObject*>(descr)->d_getset;
        entry.get = def->get;
        entry.closure = def->closure;
      }
      entry.version = version_of(entry);
      entries_.push_back(std::move(entry));
    }
  }
  bool clear() const {
    for (const auto& entry : entries_)
      if (version_of(entry) != entry.version) return false;
    return true;
  }
  int traverse(visitproc visit, void* arg) const {
    for (const auto& entry : entries_) Py_VISIT(entry.tensor.ptr());
    return 0;
  }
  void reset() { entries_.clear(); }

 private:
  struct Entry {
    nb::object tensor;
    getter get;      // the `_version` getter of the tensor's type, or nullptr
    void* closure;
    long long version;
  };
  long long version_of(const Entry& entry) const {
    nb::object version = nb::steal(entry.get != nullptr ? entry.get(entry.tensor.ptr(), entry.closure)
                                                        : PyObject_GetAttr(entry.tensor.ptr(), version_name_));
    if (!version.is_valid()) throw nb::python_error();
    const long long value = PyLong_AsLongLong(version.ptr());
    if (value == -1 && PyErr_Occurred()) throw nb::python_error();
    return value;
  }
  std::vector<Entry> entries_;
  PyObject* version_name_ = nullptr;
};

// The plain Python values (numbers, strings, flags, tuples of them) that the wrapped
// module, its submodules and the plain objects they hold (a transformers config) keep in
// their instance dicts, as the tuned graphs were exported with them: an ONNX graph holds
// such a value as a constant (`x / self.temperature`), so once one is reassigned the graph
// computes another model than forward would. A call is clear while each entry's dict holds
// the very object expected (an unchanged attribute is the same object); anything else goes
// to the Python path, which compares the values themselves (a value assigned again, equal,
// is taken as seen) and runs a call whose values differ eagerly (baked_attributes.py).
// Per call, where CPython keeps a version tag per dict (3.11, 3.12: moved by every write
// that changes the dict), one read per dict: a Llama's ~110 dicts instead of its ~430
// values, which cost ~11 us per call looked up one by one (benchmarks/
// attribute_guard_cost.py). Where a dict's tag moved, the values are compared in C++ and,
// all the same objects, the new tags are taken. Later Pythons are not given the tags (3.14
// has none): every value is looked up on every call.
#if PY_VERSION_HEX < 0x030D0000
#define AITUNE_DICT_VERSION_TAGS 1
#else
#define AITUNE_DICT_VERSION_TAGS 0
#endif

class AttributeValues {
 public:
  // `entries`: (instance dict, attribute name, the value expected) each, or (dict, name,
  // None, True) where the name is expected absent from the dict (a class attribute the
  // instance reads: `temperature = 1.0` in the class body; an instance value shadows it).
  // `written`: dicts where a write alone goes to the Python path, though every watched value
  // is still the object it was (the `_parameters` and `_buffers` of the weights' modules):
  // torch.nn.utils.prune.remove deletes a weight and puts the very Parameter back with other
  // data under it (`.data = ...`), which only the Python path can see (its storage). Their
  // tags are taken now: the Python path has just looked (no write reaches them per call).
  void set(const std::vector<nb::tuple>& entries, const std::vector<nb::object>& written = {}) {
    std::vector<Written> strict;
    for (const auto& dict : written) {
      if (!PyDict_Check(dict.ptr())) throw nb::type_error("watch_attributes: `written` must be dicts");
      strict.push_back(Written{dict, tag_of(dict.ptr())});
    }
    std::vector<Entry> fresh;
    fresh.reserve(entries.size());
    std::vector<Tagged> dicts;
    for (const auto& entry : entries) {
      // A bytes key: a variable in os.environ's own dict (`os.environ._data`, keys encoded),
      // which a forward reads (environment_reads.py).
      const bool bytes_key = PyBytes_Check(entry[1].ptr());
      if ((entry.size() != 3 && entry.size() != 4) || !PyDict_Check(entry[0].ptr()) ||
          !(PyUnicode_Check(entry[1].ptr()) || bytes_key))
        throw nb::type_error(
            "watch_attributes: entries must be (dict, str or bytes, value) or (dict, str or bytes, None, True) tuples");
      const bool absent = entry.size() == 4 && PyObject_IsTrue(entry[3].ptr()) == 1;
      fresh.push_back(Entry{nb::borrow(entry[0]), bytes_key ? nb::borrow(entry[1]) : interned(nb::borrow(entry[1])),
                            absent ? nb::object() : nb::borrow(entry[2])});
      bool known = false;
      for (const auto& d : dicts) known = known || d.dict == entry[0].ptr();
      if (!known) dicts.push_back(Tagged{entry[0].ptr(), 0, PyDict_GET_SIZE(entry[0].ptr())});
    }
    entries_ = std::move(fresh);
    dicts_ = std::move(dicts);
    written_ = std::move(strict);
    tags_taken_ = false;  // the first call compares the values: some may differ already (a checkpoint's)
  }
  bool clear() const {
#if AITUNE_DICT_VERSION_TAGS
    bool moved = !tags_taken_;
    for (const auto& d : dicts_) moved = moved || tag_of(d.dict) != d.tag;
    if (!moved) return true;
#endif
    for (const auto& entry : entries_) {
      PyObject* now = PyDict_GetItemWithError(entry.dict.ptr(), entry.name.ptr());
      if (now != entry.value.ptr()) {  // an absent one's value is null
        if (now == nullptr && PyErr_Occurred()) throw nb::python_error();
        return false;
      }
    }
    // A key added (a submodule appended to a Sequential's `_modules`) leaves every watched
    // value as it was: the Python path decides whether it matters (and calls set() again).
    for (const auto& d : dicts_)
      if (PyDict_GET_SIZE(d.dict) != d.size) return false;
#if AITUNE_DICT_VERSION_TAGS
    for (const auto& d : written_)
      if (tag_of(d.dict.ptr()) != d.tag) return false;
#endif
    take_tags();  // written, but every value is the object it was: the dicts as they are now
    return true;
  }
  std::size_t size() const noexcept { return entries_.size(); }
  int traverse(visitproc visit, void* arg) const {
    for (const auto& entry : entries_) {
      Py_VISIT(entry.dict.ptr());
      if (entry.value.is_valid()) Py_VISIT(entry.value.ptr());
    }
    for (const auto& d : written_) Py_VISIT(d.dict.ptr());
    return 0;
  }
  void reset() noexcept {
    entries_.clear();
    dicts_.clear();
    written_.clear();
    tags_taken_ = false;
  }

 private:
  struct Entry {
    nb::object dict;   // the instance dict (a module's, or a plain object's it holds)
    nb::object name;   // interned str (bytes: an environment variable's key)
    nb::object value;  // the object expected there; null: the name expected absent
  };
  struct Tagged {
    PyObject* dict;  // borrowed: entries_ hold it (one strong reference each, all visited by traverse:
                     // an unvisited one would keep a cycle through the dict alive)
    std::uint64_t tag;
    Py_ssize_t size;  // its number of keys when set()
  };
  static std::uint64_t tag_of(PyObject* dict) noexcept {
#if AITUNE_DICT_VERSION_TAGS
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag;  // deprecated in 3.12, still kept there
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#else
    (void)dict;
    return 0;
#endif
  }
  void take_tags() const {
    for (auto& d : dicts_) d.tag = tag_of(d.dict);
    tags_taken_ = true;
  }
  std::vector<Entry> entries_;
  struct Written {
    nb::object dict;    // held (visited by traverse)
    std::uint64_t tag;  // as set() found it
  };
  std::vector<Written> written_;  // set()'s `written` dicts
  mutable std::vector<Tagged> dicts_;  // each dict of entries_ once, with its tag when last clear
  mutable bool tags_taken_ = false;    // the tags are those of dicts whose every value was expected
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
  WeightVersions weights;                 // the weights tuned graphs hold copies of, unchanged
  AttributeValues values;                 // the plain Python values tuned graphs hold as constants, unchanged
  // A no-argument callable checked only until the Python path has said what it is there for
  // (torch.is_grad_enabled: the first call with gradients on says the weights get none);
  // none: nothing checked.
  nb::object until_said = nb::object();

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
    if (until_said.is_valid()) {
      nb::object value = nb::steal(PyObject_CallNoArgs(until_said.ptr()));
      if (!value.is_valid()) throw nb::python_error();
      if (truthy(value.ptr())) return false;
    }
    for (const auto& name : attributes) {
      nb::object value = nb::steal(PyObject_GetAttr(module, name.ptr()));
      if (!value.is_valid()) throw nb::python_error();
      if (truthy(value.ptr())) return false;
    }
    return submodules.clear() && weights.clear() && values.clear();
  }
};

}  // namespace aitune::python
