// aitune::Error -> one Python exception type per ErrorCode (also subclassing the
// built-in type a Python user would catch: ValueError, TypeError, OSError).
#include <map>
#include <string_view>

#include "aitune/error.hpp"
#include "bindings.hpp"

namespace nb = nanobind;

namespace aitune::python {
namespace {

std::map<ErrorCode, PyObject*>& types() {
  static std::map<ErrorCode, PyObject*> t;
  return t;
}

PyObject* make_type(nb::module_& m, const char* name, std::initializer_list<PyObject*> bases, const char* doc) {
  nb::tuple base_tuple = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(bases.size())));
  Py_ssize_t i = 0;
  for (PyObject* b : bases) {
    Py_INCREF(b);
    PyTuple_SET_ITEM(base_tuple.ptr(), i++, b);
  }
  std::string qualified = std::string("aitune._core.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base_tuple.ptr(), nullptr);
  if (!type) throw nb::python_error();
  m.attr(name) = nb::handle(type);  // the module keeps the reference
  return type;
}

}  // namespace

void bind_errors(nb::module_& m) {
  PyObject* base = make_type(m, "AituneError", {PyExc_RuntimeError}, "Base of every aitune error.");
  PyObject* invalid = make_type(m, "InvalidArgumentError", {base, PyExc_ValueError}, "A value that is not allowed.");
  auto& t = types();
  t[ErrorCode::kInvalidArgument] = invalid;
  t[ErrorCode::kShapeMismatch] =
      make_type(m, "ShapeMismatchError", {invalid}, "A tensor's rank or shape is outside what the graph accepts.");
  t[ErrorCode::kDTypeMismatch] =
      make_type(m, "DTypeMismatchError", {invalid, PyExc_TypeError}, "A tensor's dtype differs from the graph's.");
  t[ErrorCode::kProviderUnavailable] = make_type(m, "ProviderUnavailableError", {base},
                                                 "An execution provider (or ONNX Runtime) cannot be loaded here.");
  t[ErrorCode::kModelInvalid] =
      make_type(m, "ModelInvalidError", {base, PyExc_ValueError}, "A model file is missing, unreadable or rejected.");
  t[ErrorCode::kCheckpointCorrupt] =
      make_type(m, "CheckpointCorruptError", {base}, "A checkpoint fails its integrity checks.");
  t[ErrorCode::kState] = make_type(m, "StateError", {base}, "The object is in a state where the call is not allowed.");
  t[ErrorCode::kIo] = make_type(m, "AituneIOError", {base, PyExc_OSError}, "A file could not be read or written.");
  t[ErrorCode::kInternal] = make_type(m, "InternalError", {base}, "An unexpected failure inside ONNX Runtime or aitune.");
  t[ErrorCode::kOutOfMemory] =
      make_type(m, "OutOfMemoryError", {base}, "Host or device memory ran out (a session, a run, a copy).");
  t[ErrorCode::kCudaGraphCapture] = make_type(m, "CudaGraphCaptureError", {base},
                                              "A model cannot be captured as a CUDA graph, or a capture or replay failed.");
  t[ErrorCode::kBackendUnavailable] = make_type(
      m, "BackendUnavailableError", {base},
      "A checkpoint graph's backend cannot run here (a torch.compile graph outside the Python front end).");
  t[ErrorCode::kUnsupportedDType] = make_type(
      m, "UnsupportedDTypeError", {base, PyExc_TypeError},
      "The execution provider has no kernel for an operator at the model's dtype (bfloat16 on ONNX Runtime's CPU).");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      // Messages quote file contents (a manifest's bytes, a path); Python needs valid
      // UTF-8, so bytes that are not become \xNN escapes instead of a UnicodeDecodeError.
      const std::string_view what(e.what());
      PyObject* message = PyUnicode_DecodeUTF8(what.data(), static_cast<Py_ssize_t>(what.size()), "backslashreplace");
      if (!message) return;  // the decode error stays set
      PyErr_SetObject(types().at(e.code()), message);
      Py_DECREF(message);
    }
  });
}

}  // namespace aitune::python
