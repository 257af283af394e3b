// OnnxSessionConfig and OnnxSession; tensors cross by DLPack, no copies.
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "aitune/error.hpp"
#include "aitune/onnx_session.hpp"
#include "bindings.hpp"

namespace nb = nanobind;

namespace aitune::python {

// DLPack fields of the array, without a copy; from_dlpack validates dtype and device.
TensorView view_of(const AnyArray& a, const std::string& name) {
  DLTensor t{};
  t.data = const_cast<void*>(a.data());
  t.device = DLDevice{static_cast<DLDeviceType>(a.device_type()), a.device_id()};
  t.ndim = static_cast<int32_t>(a.ndim());
  t.dtype = DLDataType{a.dtype().code, a.dtype().bits, a.dtype().lanes};
  std::vector<int64_t> shape(a.ndim()), strides(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    strides[i] = a.stride(i);
  }
  t.shape = shape.data();
  t.strides = strides.data();
  try {
    return TensorView::from_dlpack(t);
  } catch (const Error& e) {
    throw Error(e.code(), "input '" + name + "': " + e.what());
  }
}

namespace {

// An engine tensor as a nanobind array of framework F, without a copy; the owner capsule
// keeps the ORT value alive.
template <typename... Framework>
nb::object array_of(const Tensor& t) {
  auto* keep = new Tensor(t);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  const auto& v = t.view();
  std::vector<std::size_t> shape(v.shape.begin(), v.shape.end());
  auto dl = dtype_to_dlpack(v.dtype);
  nb::dlpack::dtype dtype{dl.code, dl.bits, dl.lanes};
  int device_type = v.device.kind == DeviceKind::kCPU ? nb::device::cpu::value : nb::device::cuda::value;
  return nb::cast(
      nb::ndarray<Framework...>(v.data, shape.size(), shape.data(), owner, nullptr, dtype, device_type, v.device.index));
}

nb::object to_python(const Tensor& t, const std::string& framework) {
  if (framework == "torch") return array_of<nb::pytorch>(t);
  if (framework == "numpy") {
    if (t.view().device.kind != DeviceKind::kCPU)
      throw Error(ErrorCode::kInvalidArgument, "framework='numpy' needs host outputs; this output is on " +
                                                   t.view().device.to_string() + " (use framework='torch')");
    return array_of<nb::numpy>(t);
  }
  throw Error(ErrorCode::kInvalidArgument, "unknown framework '" + framework + "'; valid values: torch, numpy");
}

nb::list outputs_to_python(const std::vector<Tensor>& outputs, const std::string& framework) {
  nb::list out;
  for (const auto& t : outputs) out.append(to_python(t, framework));
  return out;
}

}  // namespace

nb::object to_dlpack_capsule(const Tensor& tensor) { return array_of<>(tensor); }

void bind_session(nb::module_& m) {
  nb::class_<OnnxSessionConfig>(m, "OnnxSessionConfig", "How an ONNX Runtime session is created.")
      .def(
          "__init__",
          [](OnnxSessionConfig* self, ExecutionProvider provider, int device_id,
             GraphOptimizationLevel level, int intra, int inter, std::map<std::string, std::string> provider_options,
             std::map<std::string, std::string> session_config) {
            new (self) OnnxSessionConfig{provider, device_id, level, intra, inter, std::move(provider_options),
                                                std::move(session_config)};
          },
          nb::arg("provider") = ExecutionProvider::kCUDA, nb::arg("device_id") = 0,
          nb::arg("graph_optimization_level") = GraphOptimizationLevel::kAll, nb::arg("intra_op_threads") = 0,
          nb::arg("inter_op_threads") = 0, nb::arg("provider_options") = std::map<std::string, std::string>{},
          nb::arg("session_config") = std::map<std::string, std::string>{})
      .def_rw("provider", &OnnxSessionConfig::provider)
      .def_rw("device_id", &OnnxSessionConfig::device_id)
      .def_rw("graph_optimization_level", &OnnxSessionConfig::graph_optimization_level)
      .def_rw("intra_op_threads", &OnnxSessionConfig::intra_op_threads)
      .def_rw("inter_op_threads", &OnnxSessionConfig::inter_op_threads)
      .def_rw("provider_options", &OnnxSessionConfig::provider_options)
      .def_rw("session_config", &OnnxSessionConfig::session_config)
      .def_rw("in_place_outputs", &OnnxSessionConfig::in_place_outputs,
              "Write each output that updates an input (a ScatterND of an input nothing else reads, a KV "
              "cache) into that input's buffer: the input is updated in place.")
      .def_rw("output_aliases", &OnnxSessionConfig::output_aliases,
              "Outputs the caller declares written into an input's buffer: output name -> input name.")
      .def("to_json", &OnnxSessionConfig::to_json, nb::arg("indent") = 2)
      .def_static("from_json", &OnnxSessionConfig::from_json, nb::arg("text"))
      .def("__eq__", [](const OnnxSessionConfig& a, const OnnxSessionConfig& b) { return a == b; })
      .def("__repr__", [](const OnnxSessionConfig& c) { return "OnnxSessionConfig(" + c.to_json(-1) + ")"; });

  nb::class_<IoInfo>(m, "IoInfo", "A graph input or output as the model declares it.")
      .def_ro("name", &IoInfo::name)
      .def_prop_ro("dtype", [](const IoInfo& io) { return std::string(dtype_name(io.dtype)); })
      .def_ro("shape", &IoInfo::shape)
      .def_ro("symbolic_dims", &IoInfo::symbolic_dims)
      .def_ro("rank_known", &IoInfo::rank_known, "False where the model declares no shape (an output's rank unknown)")
      .def("__repr__", [](const IoInfo& io) {
        return "IoInfo(" + io.name + ": " + std::string(dtype_name(io.dtype)) + shape_to_string(io.shape) + ")";
      });

  nb::class_<OnnxSession>(m, "OnnxSession", "One ONNX model in one ONNX Runtime session.")
      .def_static(
          "create",
          [](const std::string& path, const OnnxSessionConfig& config, std::optional<GraphSpec> spec) {
            nb::gil_scoped_release release;
            return OnnxSession::create(path, config, spec);
          },
          nb::arg("model_path"), nb::arg("config"), nb::arg("spec") = nb::none())
      .def_prop_ro("inputs", &OnnxSession::inputs)
      .def_prop_ro("outputs", &OnnxSession::outputs)
      .def_prop_ro("graph_spec", &OnnxSession::graph_spec)
      .def_prop_ro("config", &OnnxSession::config)
      .def_prop_ro("model_path", &OnnxSession::model_path)
      .def_prop_ro("output_aliases", &OnnxSession::output_aliases,
                   "Per output, the index of the input whose buffer it is written into (-1: none).")
      .def_prop_ro("device", [](const OnnxSession& b) { return b.device().to_string(); })
      .def_prop_ro("state", [](const OnnxSession& b) { return std::string(session_state_name(b.state())); })
      .def_prop_ro("opset", &OnnxSession::opset)
      .def_prop_ro("cuda_stream", &OnnxSession::cuda_stream,
                   "The CUDA stream the session runs on (an int); 0 for CPU and TensorRT sessions.")
      .def("activate", &OnnxSession::activate, nb::call_guard<nb::gil_scoped_release>())
      .def("deactivate", &OnnxSession::deactivate, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "infer",
          [](const OnnxSession& b, const std::vector<AnyArray>& arrays, const std::string& framework,
             std::optional<std::uintptr_t> stream) {
            std::vector<TensorView> views;
            views.reserve(arrays.size());
            const auto& ins = b.inputs();
            for (std::size_t i = 0; i < arrays.size(); ++i)
              views.push_back(view_of(arrays[i], i < ins.size() ? ins[i].name : std::to_string(i)));
            std::vector<Tensor> outputs;
            {
              nb::gil_scoped_release release;
              outputs = stream ? b.infer_on_stream(views, *stream) : b.infer(views);
            }
            return outputs_to_python(outputs, framework);
          },
          nb::arg("inputs"), nb::arg("framework") = "torch", nb::arg("stream") = nb::none(),
          "Runs the model on arrays in the order of `inputs`; returns zero-copy outputs. Without "
          "`stream` the inputs must be ready and the outputs are ready on return; with `stream` "
          "(a cudaStream_t as an int, e.g. torch.cuda.current_stream().cuda_stream) the run is "
          "ordered after the work queued there and work queued there afterwards sees the outputs.")
      .def(
          "infer_named",
          [](const OnnxSession& b, const std::map<std::string, AnyArray>& arrays, const std::string& framework) {
            std::map<std::string, TensorView> views;
            for (const auto& [name, a] : arrays) views.emplace(name, view_of(a, name));
            std::vector<Tensor> outputs;
            {
              nb::gil_scoped_release release;
              outputs = b.infer_named(views);
            }
            return outputs_to_python(outputs, framework);
          },
          nb::arg("inputs"), nb::arg("framework") = "torch");
}

}  // namespace aitune::python
