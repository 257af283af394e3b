// The torch front end's C++ half: every tensor of a tuned ait.Module's call goes into an
// ONNX Runtime session and back out here, and nowhere else (aitune._core.TorchDispatch).
//
// It is front-end code, not a binding of the engine: it knows torch (DLPack capsules from
// torch._C._to_dlpack, torch's current CUDA stream, nn.Module's hooks) and the front end's
// call forms. It lives in C++ because on a small model the Python around a session call
// (nn.Module.__call__, the graph lookup, the DLPack hand-over both ways, rebuilding the
// outputs) cost more than ONNX Runtime's own Python binding adds
// (benchmarks/forward_dispatch.py); its Python half is python/aitune/torch/dispatch.py.
//
// One dispatch serves one ait.Module. The front end registers each tuned graph that runs
// in a session (`add_graph`: the session, which call tensor each session input takes,
// how the outputs become the module's output), and each that runs in Python
// (`add_python_graph`: torch.compile, eager; a routed call hands its tensors to the
// graph's Python run, which makes the module's output) and then:
//  - `run(graph, tensors)`: the front end's general path, after it bound and flattened a
//    call and found its graph; takes any tensor (views are made contiguous, tensors that
//    require grad are detached; a tensor the session cannot take is an error naming it).
//  - routes (`add_route`), added after the general path ran a call of plain tensors, or of
//    tuples / lists of plain tensors (a decode step's KV cache, one tensor per layer): keyed
//    by what resolving such a call depends on (how many values are positional, the names
//    of the keyword ones, each value's kind: a tensor, or a tuple or list and its length,
//    and each tensor's dtype, rank and device). Calling the dispatch with the
//    module (`__call__`) checks first what nn.Module.__call__ and the front end's forward
//    would check (hooks, tracing, recording, eager mode: CallGuards), and serves a call a
//    route matches without any Python. The routes are the one cache of "which graph".
// A call no route serves (other keywords, a guard set, a non-tensor or a tensor subclass,
// a container of another kind or length, nested containers,
// a tensor that requires grad, a strided view, an unseen dtype or rank, a shape the
// session refuses) goes to the fallback, nn.Module.__call__, whose general path owns every
// error message, autograd (issue 17) and the eager fallback.
#include <dlpack/dlpack.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "aitune/error.hpp"
#include "aitune/onnx_session.hpp"
#include "../bindings.hpp"
#include "call_guards.hpp"

namespace nb = nanobind;

namespace aitune::python {
namespace {

// What one tensor of a route's call must be.
struct ArgumentKind {
  DLDataType dtype;
  int32_t ndim;
  DLDevice device;

  bool matches(const DLTensor& t) const noexcept {
    return t.dtype.code == dtype.code && t.dtype.bits == dtype.bits && t.dtype.lanes == dtype.lanes &&
           t.ndim == ndim && t.device.device_type == device.device_type && t.device.device_id == device.device_id;
  }
  bool operator==(const ArgumentKind& o) const noexcept {
    return dtype.code == o.dtype.code && dtype.bits == o.dtype.bits && dtype.lanes == o.dtype.lanes &&
           ndim == o.ndim && device.device_type == o.device.device_type && device.device_id == o.device.device_id;
  }
};

// A tuned graph: one that runs in a session, or one that runs in Python (torch.compile,
// eager: `python_run`, session null).
struct Graph {
  nb::object session_object;  // keeps the session alive while the graph is registered
  const OnnxSession* session = nullptr;
  nb::object python_run;  // list of the call's tensors (recording order) -> the module's output
  std::size_t inputs = 0;          // tensors per call, in the front end's recording order
  std::vector<std::size_t> order;  // session input i <- call tensor order[i]
  nb::object rebuild;              // list of outputs -> the module's output; None: the one output itself
  bool cuda = false;
  int device_index = 0;
};

// What one value of a route's call is: a tensor (kTensor), or an exact tuple or list of
// `size` tensors, which count in the call's tensors in their order.
enum class ValueKind : uint8_t { kTensor, kTuple, kList };
struct ValueForm {
  ValueKind kind = ValueKind::kTensor;
  std::size_t size = 1;
  bool operator==(const ValueForm& o) const noexcept { return kind == o.kind && size == o.size; }
};

// The form of one value of a call: a tuple's or list's (exact types) kind and length, or
// kTensor for anything else (whether it is a tensor is checked where it is taken).
ValueForm value_form(PyObject* value) noexcept {
  if (PyTuple_CheckExact(value)) return {ValueKind::kTuple, static_cast<std::size_t>(PyTuple_GET_SIZE(value))};
  if (PyList_CheckExact(value)) return {ValueKind::kList, static_cast<std::size_t>(PyList_GET_SIZE(value))};
  return {};
}

struct Route {
  // The call's values: `positional` positional ones, then `keywords` by name (in the
  // order the front end binds them), each of the form values[v]; its tensors (the values'
  // tensors in that order, a container's in its order) each of the kind arguments[i].
  std::size_t positional = 0;
  std::vector<nb::object> keywords;  // interned str
  std::vector<ValueForm> values;
  std::vector<ArgumentKind> arguments;
  std::shared_ptr<const Graph> graph;
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

  /// Registers a graph run by `session` on calls of `inputs` tensors: session input i
  /// takes call tensor order[i]; `rebuild` turns the list of outputs into the module's
  /// output (None: the session's one output is the module's output). Returns its index.
  std::size_t add_graph(nb::object session, std::vector<std::size_t> order, std::size_t inputs, nb::object rebuild) {
    if (!nb::isinstance<OnnxSession>(session))
      throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add_graph: session must be an OnnxSession, got " +
                                                   nb::cast<std::string>(nb::str(session.type())));
    auto graph = std::make_shared<Graph>();
    graph->session = nb::inst_ptr<OnnxSession>(session);
    graph->session_object = std::move(session);
    const auto& session_inputs = graph->session->inputs();
    if (order.size() != session_inputs.size())
      throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add_graph: order has " + std::to_string(order.size()) +
                                                   " entries, the session takes " +
                                                   std::to_string(session_inputs.size()) + " inputs");
    for (auto i : order)
      if (i >= inputs)
        throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add_graph: order names tensor " + std::to_string(i) +
                                                     " of a call of " + std::to_string(inputs));
    graph->inputs = inputs;
    graph->order = std::move(order);
    graph->rebuild = std::move(rebuild);
    const Device device = graph->session->device();
    graph->cuda = device.kind == DeviceKind::kCUDA;
    graph->device_index = device.index;
    graphs_.push_back(std::move(graph));
    return graphs_.size() - 1;
  }

  /// Registers a graph that runs in Python on calls of `inputs` tensors: a route's call
  /// is handed to `run(list of the call's tensors in recording order)`, whose result is
  /// the module's output. So a torch.compile graph's calls skip nn.Module.__call__, the
  /// proxy's forward, binding and flattening as a session's do (issue 28). Returns its index.
  std::size_t add_python_graph(nb::object run, std::size_t inputs) {
    if (!PyCallable_Check(run.ptr()))
      throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add_python_graph: run must be callable, got " +
                                                   nb::cast<std::string>(nb::str(run.type())));
    auto graph = std::make_shared<Graph>();
    graph->python_run = std::move(run);
    graph->inputs = inputs;
    graphs_.push_back(std::move(graph));
    return graphs_.size() - 1;
  }

  /// Serves calls like `sample` (a sequence of values: the positional ones, then those
  /// passed by the names in `keywords`, in that order; each a tensor, or a tuple or list
  /// of tensors) with graph `index`. False when such a route exists already.
  bool add_route(const nb::sequence& sample, std::size_t index, std::vector<nb::object> keywords) {
    auto route = std::make_shared<Route>();
    route->graph = graph_at(index, "add_route");
    auto add_tensor = [&](nb::handle argument) {
      if (Py_TYPE(argument.ptr()) != reinterpret_cast<PyTypeObject*>(tensor_type_.ptr()))
        throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add_route: value " +
                                                     std::to_string(route->values.size()) +
                                                     " is not a " + nb::cast<std::string>(nb::str(tensor_type_)) +
                                                     " nor a tuple or list of them");
      nb::object capsule = to_dlpack_(argument);
      const DLTensor* t = capsule_tensor(capsule.ptr());
      if (t == nullptr) throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add_route: to_dlpack gave no DLPack capsule");
      TensorView::from_dlpack(*t);  // a dtype or device the engine cannot take fails here, not per call
      route->arguments.push_back({t->dtype, t->ndim, t->device});
    };
    for (nb::handle value : sample) {
      const ValueForm form = value_form(value.ptr());
      if (form.kind == ValueKind::kTensor) add_tensor(value);
      else
        for (nb::handle item : nb::borrow<nb::sequence>(value)) add_tensor(item);
      route->values.push_back(form);
    }
    if (route->arguments.size() != route->graph->inputs)
      throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add_route: a call of " +
                                                   std::to_string(route->arguments.size()) + " tensors for graph " +
                                                   std::to_string(index) + ", which takes " +
                                                   std::to_string(route->graph->inputs));
    if (keywords.size() > route->values.size())
      throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add_route: " + std::to_string(keywords.size()) +
                                                   " keywords for a call of " +
                                                   std::to_string(route->values.size()) + " values");
    for (auto& name : keywords) {
      if (!PyUnicode_Check(name.ptr()))
        throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.add_route: keywords must be str, got " +
                                                     nb::cast<std::string>(nb::str(name.type())));
      name = interned(std::move(name));
    }
    route->positional = route->values.size() - keywords.size();
    route->keywords = std::move(keywords);
    for (const auto& r : routes_)
      if (r->positional == route->positional && same_keywords(*r, *route) && r->values == route->values &&
          r->arguments == route->arguments)
        return false;
    routes_.push_back(std::move(route));
    return true;
  }

  /// The module's output of graph `index` for `tensors` (the call's tensors in recording
  /// order): the general path. Views are copied to dense memory and tensors that require
  /// grad detached (the caller decided the call needs no autograd); a tensor the session
  /// cannot take raises aitune.InvalidArgumentError naming its input.
  nb::object run(std::size_t index, const nb::sequence& tensors) const {
    std::shared_ptr<const Graph> graph = graph_at(index, "run");
    if (graph->session == nullptr)
      throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.run: graph " + std::to_string(index) +
                                                   " runs in Python; the front end calls it itself");
    const std::size_t n = nb::len(tensors);
    if (n != graph->inputs)
      throw Error(ErrorCode::kInvalidArgument, "TorchDispatch.run: " + std::to_string(n) + " tensors for graph " +
                                                   std::to_string(index) + ", which takes " +
                                                   std::to_string(graph->inputs));
    const auto& names = graph->session->inputs();
    std::vector<nb::object> capsules(n);  // alive until the run is over: they own the inputs
    std::vector<const DLTensor*> dl(n, nullptr);
    std::vector<PyObject*> passed(graph->order.size());  // the tensors the session got, owned by `kept`
    std::vector<nb::object> kept(graph->order.size());
    for (std::size_t k = 0; k < graph->order.size(); ++k) {
      const std::size_t i = graph->order[k];
      nb::object tensor = tensors[i];
      auto who = [&] { return "input '" + names[k].name + "'"; };
      int is_tensor = PyObject_IsInstance(tensor.ptr(), tensor_type_.ptr());
      if (is_tensor < 0) throw nb::python_error();
      if (!is_tensor)
        throw Error(ErrorCode::kInvalidArgument, who() + ": expected a torch.Tensor, got " +
                                                     nb::cast<std::string>(nb::str(tensor.type())));
      if (truthy(nb::getattr(tensor, requires_grad_name_).ptr())) tensor = tensor.attr("detach")();
      capsules[i] = export_tensor(tensor, *graph, who);
      dl[i] = capsule_tensor(capsules[i].ptr());
      if (!TensorView::from_dlpack(*dl[i]).is_contiguous()) {
        tensor = tensor.attr("contiguous")();  // a copy: an in-place output is written there
        capsules[i] = export_tensor(tensor, *graph, who);
        dl[i] = capsule_tensor(capsules[i].ptr());
      }
      kept[k] = tensor;
      passed[k] = tensor.ptr();
    }
    std::vector<TensorView> views;
    views.reserve(graph->order.size());
    for (auto i : graph->order) views.push_back(TensorView::from_dlpack(*dl[i]));
    return execute(*graph, views, passed);
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
    const std::size_t n_positional = args.size(), n_values = n_positional + kwargs.size();
    std::vector<PyObject*> call_values(n_values);  // borrowed from args and kwargs
    const Route* form = nullptr;
    for (const auto& r : routes_)
      if (take_form(*r, args, kwargs, call_values)) {
        form = r.get();
        break;
      }
    if (form == nullptr) return nb::borrow(Py_NotImplemented);

    // The call's tensors: each value's, a tuple's or list's in their order (a list's
    // items held: the list may change while a session runs with the GIL released).
    std::vector<ValueForm> shape(n_values);
    std::vector<nb::object> values;
    for (std::size_t v = 0; v < n_values; ++v) {
      PyObject* value = call_values[v];
      shape[v] = value_form(value);
      if (shape[v].kind == ValueKind::kTensor) {
        values.push_back(nb::borrow(value));
      } else {
        const bool tuple = shape[v].kind == ValueKind::kTuple;
        for (std::size_t k = 0; k < shape[v].size; ++k) {
          const auto i = static_cast<Py_ssize_t>(k);
          values.push_back(nb::borrow(tuple ? PyTuple_GET_ITEM(value, i) : PyList_GET_ITEM(value, i)));
        }
      }
    }
    const std::size_t n = values.size();
    std::vector<nb::object> capsules(n);  // alive until the run is over: they own the inputs
    std::vector<const DLTensor*> tensors(n);
    for (std::size_t i = 0; i < n; ++i) {
      PyObject* argument = values[i].ptr();
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
    std::shared_ptr<const Route> route;  // shared: add_route may run while this call has the GIL released
    for (const auto& r : routes_) {
      if (r->positional != n_positional || !same_keywords(*r, *form) || r->values != shape) continue;
      bool all = true;
      for (std::size_t i = 0; i < n && all; ++i) all = r->arguments[i].matches(*tensors[i]);
      if (all) {
        route = r;
        break;
      }
    }
    if (!route) return nb::borrow(Py_NotImplemented);
    if (route->graph->session == nullptr) {  // runs in Python: the tensors as they are
      nb::list call_tensors;
      for (std::size_t i = 0; i < n; ++i) call_tensors.append(values[i]);
      return route->graph->python_run(call_tensors);
    }

    std::vector<TensorView> views;
    std::vector<PyObject*> passed;
    views.reserve(route->graph->order.size());
    passed.reserve(route->graph->order.size());
    for (auto i : route->graph->order) {
      views.push_back(TensorView::from_dlpack(*tensors[i]));
      if (!views.back().is_contiguous()) return nb::borrow(Py_NotImplemented);  // the general path copies it
      passed.push_back(values[i].ptr());
    }
    return execute(*route->graph, views, passed);
  }

  std::size_t size() const noexcept { return routes_.size(); }
  std::size_t graph_count() const noexcept { return graphs_.size(); }

  /// For Python's cycle collector: every Python object the dispatch holds. A graph's
  /// `rebuild` reaches the module's graph and through it the user's code, which may hold
  /// the ait.Module that holds this dispatch (e.g. a model in a module's globals).
  int traverse(visitproc visit, void* arg) const {
    for (const nb::object* o : {&to_dlpack_, &from_dlpack_, &tensor_type_, &current_stream_, &fallback_})
      Py_VISIT(o->ptr());
    for (const auto* list : {&guards_.global_dicts, &guards_.context_vars, &guards_.calls, &guards_.attributes})
      for (const auto& o : *list) Py_VISIT(o.ptr());
    Py_VISIT(guards_.until_said.ptr());
    if (int result = guards_.submodules.traverse(visit, arg)) return result;
    if (int result = guards_.weights.traverse(visit, arg)) return result;
    if (int result = guards_.values.traverse(visit, arg)) return result;
    for (const auto& g : graphs_) {
      Py_VISIT(g->session_object.ptr());
      Py_VISIT(g->rebuild.ptr());
      Py_VISIT(g->python_run.ptr());
    }
    return 0;
  }
  /// Breaks such a cycle: the dispatch forgets its graphs and routes (it then serves
  /// nothing; the collector only clears objects nothing else can reach).
  void clear() {
    routes_.clear();
    graphs_.clear();
    guards_.submodules.reset();
    guards_.weights.reset();
    guards_.values.reset();
    guards_.until_said = nb::object();
  }

  /// The wrapped module's modules (`submodules` as given) whose mode or forward hooks
  /// differ from what tuning left: (index, "mode" or "hooks").
  /// None changed: a move of torch's hook handle counter (a hook registered elsewhere) is
  /// taken as seen, so routed calls skip Python again.
  std::vector<std::pair<std::size_t, std::string>> changed_submodules() {
    std::vector<std::pair<std::size_t, std::string>> changed;
    for (std::size_t i = 0; i < guards_.submodules.size(); ++i)
      if (const char* what = guards_.submodules.changed(i)) changed.emplace_back(i, what);
    if (changed.empty()) guards_.submodules.counter_seen();
    return changed;
  }
  /// Routed calls go to Python while `probe()` is truthy, until called again with None (the
  /// Python path said what the probe is for).
  void check_until_said(nb::object probe) { guards_.until_said = probe.is_none() ? nb::object() : std::move(probe); }
  /// Takes the submodules' hooks as they are now (and their modes, as the constructor).
  void snapshot_submodules(nb::handle training) { guards_.submodules.snapshot(training); }
  /// Routed calls need `tensors`' version counters as they are now (empty: none checked).
  void watch_weights(std::vector<nb::object> tensors) { guards_.weights.set(std::move(tensors)); }
  /// Routed calls need each (dict, name, value) entry's dict to hold that very value.
  void watch_attributes(const std::vector<nb::tuple>& entries, const std::vector<nb::object>& written) {
    guards_.values.set(entries, written);
  }
  /// Whether the watched attributes hold the values expected (the routed calls' guard).
  bool attributes_clear() const { return guards_.values.clear(); }

 private:
  std::shared_ptr<const Graph> graph_at(std::size_t index, const char* who) const {
    if (index >= graphs_.size())
      throw Error(ErrorCode::kInvalidArgument, std::string("TorchDispatch.") + who + ": no graph " +
                                                   std::to_string(index) + " (" + std::to_string(graphs_.size()) +
                                                   " registered)");
    return graphs_[index];
  }

  // torch._C._to_dlpack(tensor); a tensor torch cannot export (a meta tensor, ...) is an
  // error naming the input and the session's device.
  template <class Who>
  nb::object export_tensor(nb::handle tensor, const Graph& graph, Who who) const {
    PyObject* capsule = PyObject_CallOneArg(to_dlpack_.ptr(), tensor.ptr());
    if (capsule != nullptr && capsule_tensor(capsule) != nullptr) return nb::steal(capsule);
    Py_XDECREF(capsule);
    std::string reason = "no DLPack capsule";
    if (PyErr_Occurred()) {
      nb::python_error error;  // fetched: the error below replaces it
      reason = text_of(error.value());
    }
    throw Error(ErrorCode::kInvalidArgument,
                who() + ": tensor is on " + text_of(nb::getattr(tensor, "device")) + " but the " +
                    std::string(execution_provider_name(graph.session->config().provider)) + " session runs on " +
                    graph.session->device().to_string() + " (" + reason + ")");
  }

  // Runs `graph` on `views` (in session input order; `passed`: the tensors they are of),
  // ordered with torch's current stream on CUDA (no host wait), and makes the module's
  // output. An output the session wrote into an input's buffer (a KV cache updated in
  // place, OnnxSession.output_aliases) is that input's own tensor: the caller gets back
  // the tensor it passed, and nothing but the caller owns that memory.
  nb::object execute(const Graph& graph, const std::vector<TensorView>& views,
                     const std::vector<PyObject*>& passed) const {
    std::vector<Tensor> outputs;
    if (graph.cuda) {
      auto stream = nb::cast<std::uintptr_t>(current_stream_(graph.device_index));
      nb::gil_scoped_release release;
      outputs = graph.session->infer_on_stream(views, stream);
    } else {
      nb::gil_scoped_release release;
      outputs = graph.session->infer(views);
    }
    const auto& aliases = graph.session->output_aliases();
    auto result = [&](std::size_t j) {
      const int input = aliases[j];
      return input >= 0 ? nb::borrow(passed[static_cast<std::size_t>(input)]) : from_dlpack_(to_dlpack_capsule(outputs[j]));
    };
    if (graph.rebuild.is_none() && outputs.size() == 1) return result(0);
    nb::list results;
    for (std::size_t j = 0; j < outputs.size(); ++j) results.append(result(j));
    return graph.rebuild.is_none() ? nb::object(results) : graph.rebuild(results);
  }

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
  std::vector<std::shared_ptr<const Graph>> graphs_;
  std::vector<std::shared_ptr<const Route>> routes_;
};

int dispatch_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));  // heap types: the instance holds its type
  if (!nb::inst_ready(self)) return 0;
  return nb::inst_ptr<TorchDispatch>(self)->traverse(visit, arg);
}

int dispatch_clear(PyObject* self) {
  if (nb::inst_ready(self)) nb::inst_ptr<TorchDispatch>(self)->clear();
  return 0;
}

PyType_Slot dispatch_slots[] = {
    {Py_tp_traverse, reinterpret_cast<void*>(dispatch_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(dispatch_clear)},
    {0, nullptr},
};

}  // namespace

void bind_torch_dispatch(nb::module_& m) {
  nb::class_<TorchDispatch>(m, "TorchDispatch", nb::type_slots(dispatch_slots),
                            "The torch front end's C++ half: the one path of a tuned ait.Module's tensors into "
                            "and out of its sessions. `run` serves the front end's general path; routes serve "
                            "calls like those they were added for without Python, when the guards are clear, and "
                            "hand any other call to `fallback` (nn.Module.__call__).")
      .def(
          "__init__",
          [](TorchDispatch* self, nb::object to_dlpack, nb::object from_dlpack, nb::object tensor_type,
             nb::object current_stream, nb::object fallback, std::vector<nb::object> global_dicts,
             std::vector<nb::object> context_vars, std::vector<nb::object> calls, std::vector<nb::object> attributes,
             std::vector<nb::object> submodules, nb::object training, nb::object hook_counter) {
            CallGuards guards{std::move(global_dicts), std::move(context_vars), std::move(calls),
                              std::move(attributes), {}};
            guards.submodules.set(std::move(submodules), training, hook_counter);
            new (self) TorchDispatch(std::move(to_dlpack), std::move(from_dlpack), std::move(tensor_type),
                                     std::move(current_stream), std::move(fallback), std::move(guards));
          },
          nb::arg("to_dlpack"), nb::arg("from_dlpack"), nb::arg("tensor_type"), nb::arg("current_stream"),
          nb::arg("fallback"), nb::arg("global_dicts"), nb::arg("context_vars"), nb::arg("calls"),
          nb::arg("attributes"), nb::arg("submodules") = std::vector<nb::object>{},
          nb::arg("training").none() = nb::none(), nb::arg("hook_counter").none() = nb::none(),
          "to_dlpack/from_dlpack: torch's capsule converters; tensor_type: torch.Tensor; "
          "current_stream: device index -> torch's current cudaStream_t as an int (CUDA sessions); "
          "fallback(module, *args, **kwargs): every call no route serves. Guards, all of which must be falsy "
          "for a call to be served: global_dicts (dicts), context_vars (ContextVars), calls (no-argument "
          "callables), attributes (names of attributes of the module); and submodules (the wrapped module, "
          "then its submodules) must be as they are now: each in the mode it has (where the wrapped module is "
          "in mode `training`, else all in that mode; None: modes not checked), the submodules' forward hooks "
          "the ones registered now, hook_counter.next_id (torch's RemovableHandle: hooks registered anywhere) "
          "as it is now.")
      .def("check_until_said", &TorchDispatch::check_until_said, nb::arg("probe").none(),
           "Routed calls go to the Python path while probe() is truthy, until this is called with None.")
      .def("changed_submodules", &TorchDispatch::changed_submodules,
           "(index into submodules, 'mode' or 'hooks') for each module whose mode or forward hooks differ from "
           "what the dispatch expects; when none does, hook_counter's move is taken as seen.")
      .def("snapshot_submodules", &TorchDispatch::snapshot_submodules, nb::arg("training").none(),
           "Expect the submodules' forward hooks as they are now (modes as the constructor takes them).")
      .def("watch_weights", &TorchDispatch::watch_weights, nb::arg("tensors"),
           "Serve routed calls only while each of `tensors` (parameters and buffers tuned graphs hold copies "
           "of) has the version counter it has now; a call after an in-place write goes to `fallback`.")
      .def("watch_attributes", &TorchDispatch::watch_attributes, nb::arg("entries"),
           nb::arg("written") = std::vector<nb::object>{},
           "Serve routed calls only while each (instance dict, attribute name, value) entry's dict holds that "
           "very object under that name (plain values tuned graphs hold as constants), and each (dict, name, "
           "None, True) entry's dict holds nothing under it (a class attribute read through the instance); "
           "else `fallback`. A write to one of the `written` dicts (the weights' registries) goes to "
           "`fallback` too, the values unchanged or not (where Python keeps dict version tags: 3.11, 3.12).")
      .def("attributes_clear", &TorchDispatch::attributes_clear,
           "Whether every attribute watch_attributes was given holds its value (compared by identity).")
      .def("add_graph", &TorchDispatch::add_graph, nb::arg("session").none(), nb::arg("order"), nb::arg("inputs"),
           nb::arg("rebuild").none(),
           "Register a graph run by `session` on calls of `inputs` tensors (recording order): session input i "
           "takes call tensor order[i]; rebuild(list of outputs) makes the module's output, None when the "
           "session's one output is the output. Returns the graph's index.")
      .def("add_python_graph", &TorchDispatch::add_python_graph, nb::arg("run"), nb::arg("inputs"),
           "Register a graph run in Python on calls of `inputs` tensors: a route's call becomes "
           "run(list of its tensors in recording order), the module's output. Returns the graph's index.")
      .def("add_route", &TorchDispatch::add_route, nb::arg("sample"), nb::arg("graph"),
           nb::arg("keywords") = std::vector<nb::object>{},
           "Serve calls with the form of `sample` (the positional values, then those passed by the names in "
           "`keywords`, in that order; each a tensor, or a tuple or list of tensors, of that kind and length) "
           "and its tensors' dtypes, ranks and devices with graph index `graph`. False when such a route "
           "exists already.")
      .def("run", &TorchDispatch::run, nb::arg("graph"), nb::arg("tensors"),
           "The module's output of graph index `graph` for the call's tensors in recording order (the general "
           "path): views are made contiguous, tensors that require grad detached.")
      .def("__call__", &TorchDispatch::call_module, nb::arg("module"), nb::arg("args"), nb::arg("kwargs"),
           "module(*args, **kwargs): by a route, or by fallback.")
      .def(
          "serve", [](const TorchDispatch& self, const nb::tuple& args, const nb::dict& kwargs) { return self.serve(args, kwargs); },
          nb::arg("args"), nb::arg("kwargs") = nb::dict(),
          "The module's output for these tensors by a route, or NotImplemented (no guards, no fallback).")
      .def("__len__", &TorchDispatch::size, "Number of routes.")
      .def_prop_ro("graph_count", &TorchDispatch::graph_count, "Number of registered graphs.");
}

}  // namespace aitune::python
