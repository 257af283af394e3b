// TorchDispatch: the hot path of a tuned ait.Module. A call made only of plain torch
// tensors goes to its ONNX Runtime session and back in one C++ call: DLPack capsules in
// (torch._C._to_dlpack), the session run, DLPack capsules out (torch._C._from_dlpack).
//
// Why in C++: on a small model the Python around a session call (nn.Module.__call__,
// the graph lookup, the numpy or DLPack hand-over both ways, rebuilding the outputs)
// cost more than ONNX Runtime's own Python binding adds (benchmarks/forward_dispatch.py).
//
// The dispatch only serves calls it recognises: a route is added by the front end after
// its general path resolved such a call (binding, flattening, graph identity), keyed by
// what that path depends on for calls of tensors: how many are positional, the names of
// the keyword ones, and each one's dtype, rank and device. Calling it with the module
// checks first what nn.Module.__call__ and aitune's forward would check (hooks, tracing,
// recording, eager mode: CallGuards).
// Anything it does not serve (other keywords, a guard set, a non-tensor or a tensor subclass,
// a tensor that requires grad (issue 17: it was exported detached), a strided view, an unseen dtype or rank, a shape the
// session refuses) goes to the fallback, nn.Module.__call__, whose general path owns
// every error message and the eager fallback.
#include <dlpack/dlpack.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "aitune/error.hpp"
#include "aitune/onnx_session.hpp"
#include "bindings.hpp"

namespace nb = nanobind;

namespace aitune::python {
namespace {

// What one positional argument of a route must be.
struct ArgumentKind {
  DLDataType dtype;
  int32_t ndim;
  DLDevice device;

  bool matches(const DLTensor& t) const noexcept {
    return t.dtype.code == dtype.code && t.dtype.bits == dtype.bits && t.dtype.lanes == dtype.lanes &&
           t.ndim == ndim && t.device.device_type == device.device_type && t.device.device_id == device.device_id;
  }
};

struct Route {
  // The call's tensors: `positional` positional ones, then `keywords` by name (in the
  // order the front end binds them), each of the kind arguments[i].
  std::size_t positional = 0;
  std::vector<nb::object> keywords;  // interned str
  std::vector<ArgumentKind> arguments;
  nb::object session_object;  // keeps the session alive while the route exists
  const OnnxSession* session = nullptr;
  std::vector<std::size_t> order;  // session input i <- call argument order[i]
  nb::object rebuild;              // list of outputs -> the module's output; None: the one output itself
  bool cuda = false;
  int device_index = 0;
};

// The DLTensor inside a capsule of torch._C._to_dlpack, or nullptr (error cleared).
const DLTensor* capsule_tensor(PyObject* capsule) noexcept {
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  return &managed->dl_tensor;
}

// When a module call may skip its Python path: what nn.Module.__call__ checks before it
// goes straight to forward (hooks, a compiled call, JIT tracing), and what aitune's own
// forward checks before it dispatches (no recording, not eager). All of it must be falsy.
// `name` as the interned string equal to it, so names compare by identity.
nb::object interned(nb::object name) {
  PyObject* object = name.release().ptr();
  PyUnicode_InternInPlace(&object);
  return nb::steal(object);
}

// PyObject_IsTrue, with its error raised rather than read as true.
bool truthy(PyObject* value) {
  int result = PyObject_IsTrue(value);
  if (result < 0) throw nb::python_error();
  return result != 0;
}

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

class TorchDispatch {
 public:
  TorchDispatch(nb::object to_dlpack, nb::object from_dlpack, nb::object tensor_type, nb::object current_stream,
                nb::object fallback, CallGuards guards)
      : to_dlpack_(std::move(to_dlpack)),
        from_dlpack_(std::move(from_dlpack)),
        tensor_type_(std::move(tensor_type)),
        current_stream_(std::move(current_stream)),
        fallback_(std::move(fallback)),
        guards_(std::move(guards)) {
    if (!PyType_Check(tensor_type_.ptr()))
      throw Error(ErrorCode::kInvalidArgument, "TorchDispatch: tensor_type must be a type (torch.Tensor)");
    for (const auto& d : guards_.global_dicts)
      if (!PyDict_Check(d.ptr())) throw Error(ErrorCode::kInvalidArgument, "TorchDispatch: global_dicts must be dicts");
    for (const auto& var : guards_.context_vars)
      if (!PyContextVar_CheckExact(var.ptr()))
        throw Error(ErrorCode::kInvalidArgument, "TorchDispatch: context_vars must be ContextVars");
    for (auto& name : guards_.attributes) {
      if (!PyUnicode_Check(name.ptr())) throw Error(ErrorCode::kInvalidArgument, "TorchDispatch: attributes must be str");
      name = interned(std::move(name));
    }
  }

  /// Serves calls like `sample` (a sequence of tensors: the positional ones, then those
  /// passed by the names in `keywords`, in that order) with `session`: session input i
  /// takes argument order[i]; `rebuild` turns the list of outputs into the module's
  /// output (None: the session's one output is the module's output).
  void add(const nb::sequence& sample, nb::object session, std::vector<std::size_t> order, nb::object rebuild,
           std::vector<nb::object> keywords) {
    if (!nb::isinstance<OnnxSession>(session))
      throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add: session must be an OnnxSession, got " +
                                                   nb::cast<std::string>(nb::str(session.type())));
    auto route = std::make_shared<Route>();
    route->session = nb::inst_ptr<OnnxSession>(session);
    route->session_object = std::move(session);
    std::vector<nb::object> capsules;
    for (nb::handle argument : sample) {
      if (Py_TYPE(argument.ptr()) != reinterpret_cast<PyTypeObject*>(tensor_type_.ptr()))
        throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add: argument " + std::to_string(capsules.size()) +
                                                     " is not a " + nb::cast<std::string>(nb::str(tensor_type_)));
      capsules.push_back(to_dlpack_(argument));
      const DLTensor* t = capsule_tensor(capsules.back().ptr());
      if (t == nullptr) throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add: to_dlpack gave no DLPack capsule");
      TensorView::from_dlpack(*t);  // a dtype or device the engine cannot take fails here, not per call
      route->arguments.push_back({t->dtype, t->ndim, t->device});
    }
    const auto& inputs = route->session->inputs();
    if (order.size() != inputs.size())
      throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add: order has " + std::to_string(order.size()) +
                                                   " entries, the session takes " + std::to_string(inputs.size()) +
                                                   " inputs");
    for (auto i : order)
      if (i >= route->arguments.size())
        throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add: order names argument " + std::to_string(i) +
                                                     " of a call of " + std::to_string(route->arguments.size()));
    if (keywords.size() > route->arguments.size())
      throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add: " + std::to_string(keywords.size()) +
                                                   " keywords for a call of " +
                                                   std::to_string(route->arguments.size()) + " tensors");
    for (auto& name : keywords) {
      if (!PyUnicode_Check(name.ptr()))
        throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add: keywords must be str, got " +
                                                     nb::cast<std::string>(nb::str(name.type())));
      name = interned(std::move(name));
    }
    route->positional = route->arguments.size() - keywords.size();
    route->keywords = std::move(keywords);
    route->order = std::move(order);
    route->rebuild = std::move(rebuild);
    const Device device = route->session->device();
    route->cuda = device.kind == DeviceKind::kCUDA;
    route->device_index = device.index;
    routes_.push_back(std::move(route));
  }

  /// `module(*args, **kwargs)`: served by a route when one matches and the guards are
  /// clear, else by `fallback(module, *args, **kwargs)` (nn.Module.__call__).
  nb::object call_module(nb::handle module, const nb::tuple& args, const nb::dict& kwargs) const {
    if (guards_.clear(module.ptr())) {
      try {
        nb::object result = serve(args, kwargs);
        if (!result.is(nb::handle(Py_NotImplemented))) return result;
      } catch (const Error& e) {
        // The general path raises it with the recorded graphs named, or runs eagerly.
        if (e.code() != ErrorCode::kShapeMismatch) throw;
      }
    }
    nb::object call_args = nb::steal(PySequence_Concat(nb::make_tuple(module).ptr(), args.ptr()));
    if (!call_args.is_valid()) throw nb::python_error();
    nb::object result = nb::steal(PyObject_Call(fallback_.ptr(), call_args.ptr(), kwargs.ptr()));
    if (!result.is_valid()) throw nb::python_error();
    return result;
  }

  /// The module's output for `args` and `kwargs`, or NotImplemented when no route serves them.
  nb::object serve(const nb::tuple& args, const nb::dict& kwargs) const {
    // The call's form: the first route with as many positional tensors and the same
    // keyword names; its tensors in route order.
    const std::size_t n_positional = args.size(), n = n_positional + kwargs.size();
    std::vector<PyObject*> values(n);  // borrowed from args and kwargs
    const Route* form = nullptr;
    for (const auto& r : routes_)
      if (take_form(*r, args, kwargs, values)) {
        form = r.get();
        break;
      }
    if (form == nullptr) return nb::borrow(Py_NotImplemented);

    std::vector<nb::object> capsules(n);  // alive until the run is over: they own the inputs
    std::vector<const DLTensor*> tensors(n);
    for (std::size_t i = 0; i < n; ++i) {
      PyObject* argument = values[i];
      if (Py_TYPE(argument) != reinterpret_cast<PyTypeObject*>(tensor_type_.ptr())) return nb::borrow(Py_NotImplemented);
      // A tensor that requires grad goes to the general path, which runs the call eagerly
      // when gradients are enabled (autograd intact) and detaches it otherwise;
      // torch._C._to_dlpack would export it silently, dropping its gradient.
      nb::object requires_grad = nb::steal(PyObject_GetAttr(argument, requires_grad_name_.ptr()));
      if (!requires_grad.is_valid()) throw nb::python_error();
      if (requires_grad.ptr() == Py_True) return nb::borrow(Py_NotImplemented);
      PyObject* capsule = PyObject_CallOneArg(to_dlpack_.ptr(), argument);
      if (capsule == nullptr) {
        PyErr_Clear();
        return nb::borrow(Py_NotImplemented);
      }
      capsules[i] = nb::steal(capsule);
      if ((tensors[i] = capsule_tensor(capsule)) == nullptr) return nb::borrow(Py_NotImplemented);
    }
    std::shared_ptr<const Route> route;  // shared: add() may run while this call has the GIL released
    for (const auto& r : routes_) {
      if (r->positional != n_positional || !same_keywords(*r, *form)) continue;
      bool all = true;
      for (std::size_t i = 0; i < n && all; ++i) all = r->arguments[i].matches(*tensors[i]);
      if (all) {
        route = r;
        break;
      }
    }
    if (!route) return nb::borrow(Py_NotImplemented);

    std::vector<TensorView> views;
    views.reserve(route->order.size());
    for (auto i : route->order) {
      views.push_back(TensorView::from_dlpack(*tensors[i]));
      if (!views.back().is_contiguous()) return nb::borrow(Py_NotImplemented);  // the general path copies it
    }
    std::vector<Tensor> outputs;
    if (route->cuda) {
      // Ordered with torch's current stream, as on the general path (no host wait).
      auto stream = nb::cast<std::uintptr_t>(current_stream_(route->device_index));
      nb::gil_scoped_release release;
      outputs = route->session->infer_on_stream(views, stream);
    } else {
      nb::gil_scoped_release release;
      outputs = route->session->infer(views);
    }
    capsules.clear();

    if (route->rebuild.is_none() && outputs.size() == 1) return from_dlpack_(to_dlpack_capsule(outputs[0]));
    nb::list results;
    for (const auto& t : outputs) results.append(from_dlpack_(to_dlpack_capsule(t)));
    return route->rebuild.is_none() ? nb::object(results) : route->rebuild(results);
  }

  std::size_t size() const noexcept { return routes_.size(); }

 private:
  // Whether the call is of route `r`'s form (its positional count and keyword names);
  // if so, `values` (sized for the call) holds the call's tensors in the route's order.
  static bool take_form(const Route& r, const nb::tuple& args, const nb::dict& kwargs,
                        std::vector<PyObject*>& values) {
    if (r.positional != args.size() || r.keywords.size() != kwargs.size()) return false;
    for (std::size_t k = 0; k < r.keywords.size(); ++k) {
      PyObject* value = PyDict_GetItemWithError(kwargs.ptr(), r.keywords[k].ptr());
      if (value == nullptr) {
        if (PyErr_Occurred()) throw nb::python_error();
        return false;
      }
      values[r.positional + k] = value;
    }
    for (std::size_t i = 0; i < r.positional; ++i) values[i] = args[i].ptr();
    return true;
  }
  static bool same_keywords(const Route& a, const Route& b) {
    if (a.keywords.size() != b.keywords.size()) return false;
    for (std::size_t k = 0; k < a.keywords.size(); ++k)  // interned: equal names are one object
      if (!a.keywords[k].is(b.keywords[k])) return false;
    return true;
  }

  nb::object to_dlpack_, from_dlpack_, tensor_type_, current_stream_, fallback_;
  nb::object requires_grad_name_ = interned(nb::str("requires_grad"));
  CallGuards guards_;
  std::vector<std::shared_ptr<const Route>> routes_;
};

}  // namespace

void bind_torch_dispatch(nb::module_& m) {
  nb::class_<TorchDispatch>(m, "TorchDispatch",
                            "The hot path of a tuned ait.Module: plain torch tensors to a session and back in one "
                            "C++ call. Serves calls like those its routes were added for, when its guards are clear; "
                            "hands any other call to `fallback` (the front end's general path).")
      .def(
          "__init__",
          [](TorchDispatch* self, nb::object to_dlpack, nb::object from_dlpack, nb::object tensor_type,
             nb::object current_stream, nb::object fallback, std::vector<nb::object> global_dicts,
             std::vector<nb::object> context_vars, std::vector<nb::object> calls, std::vector<nb::object> attributes) {
            new (self) TorchDispatch(std::move(to_dlpack), std::move(from_dlpack), std::move(tensor_type),
                                     std::move(current_stream), std::move(fallback),
                                     CallGuards{std::move(global_dicts), std::move(context_vars), std::move(calls),
                                                std::move(attributes)});
          },
          nb::arg("to_dlpack"), nb::arg("from_dlpack"), nb::arg("tensor_type"), nb::arg("current_stream"),
          nb::arg("fallback"), nb::arg("global_dicts"), nb::arg("context_vars"), nb::arg("calls"),
          nb::arg("attributes"),
          "to_dlpack/from_dlpack: torch's capsule converters; tensor_type: torch.Tensor (exact type only); "
          "current_stream: device index -> torch's current cudaStream_t as an int (CUDA sessions); "
          "fallback(module, *args, **kwargs): every call not served. Guards, all of which must be falsy "
          "for a call to be served: global_dicts (dicts), context_vars (ContextVars), calls (no-argument "
          "callables), attributes (names of attributes of the module).")
      .def("add", &TorchDispatch::add, nb::arg("sample"), nb::arg("session").none(), nb::arg("order"),
           nb::arg("rebuild").none(), nb::arg("keywords") = std::vector<nb::object>{},
           "Serve calls with the count, dtypes, ranks and devices of `sample` (the positional tensors, then "
           "those passed by the names in `keywords`, in that order) with `session`; session input i takes "
           "argument order[i]; rebuild(list of outputs) makes the module's output, None when the session's "
           "one output is the output.")
      .def("__call__", &TorchDispatch::call_module, nb::arg("module"), nb::arg("args"), nb::arg("kwargs"),
           "module(*args, **kwargs): by a route, or by fallback.")
      .def(
          "serve", [](const TorchDispatch& self, const nb::tuple& args, const nb::dict& kwargs) { return self.serve(args, kwargs); },
          nb::arg("args"), nb::arg("kwargs") = nb::dict(),
          "The module's output for these tensors by a route, or NotImplemented (no guards, no fallback).")
      .def("__len__", &TorchDispatch::size, "Number of routes.");
}

}  // namespace aitune::python
