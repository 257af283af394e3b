// The CUDA execution provider (ORT's plugin-EP route): options, variants, sessions on a
// stream aitune knows, Triton's "cuda" accelerator.
#include <algorithm>
#include <unordered_map>

#include "aitune/error.hpp"
#include "ort/ort_runtime_impl.hpp"
#include "providers/provider_registry.hpp"
#include "providers/session_setup.hpp"

namespace aitune::providers {
namespace {

using detail::ort_call;

void append_cuda(detail::SessionSetup& setup, OrtRuntime& runtime, const OnnxSessionConfig& config) {
  auto& rt = detail::runtime_impl(runtime);
  // Plugin-EP route: the only one in this ORT build that takes every CUDA option as a string.
  const auto& devices = rt.cuda_ep_devices();
  if (config.device_id < 0 || static_cast<std::size_t>(config.device_id) >= devices.size())
    throw Error(ErrorCode::kInvalidArgument, "device_id " + std::to_string(config.device_id) + " but " +
                                                 std::to_string(devices.size()) + " CUDA device(s) are present");
  const auto& device = devices[config.device_id];
  std::unordered_map<std::string, std::string> options(config.provider_options.begin(), config.provider_options.end());
  // The session runs on a stream aitune knows, so calls can be ordered with the
  // caller's stream by events. Verified on an H200: this plugin route honours
  // user_compute_stream only together with has_user_compute_stream=1 (without it,
  // cuBLAS crashed in the first run).
  if (auto it = options.find("user_compute_stream"); it != options.end()) {
    try {
      setup.stream = static_cast<std::uintptr_t>(std::stoull(it->second));
    } catch (const std::exception&) {
      throw Error(ErrorCode::kInvalidArgument,
                  "provider option user_compute_stream='" + it->second + "' is not a stream address");
    }
  } else {
    // Blocking: torch's default stream is the legacy stream, and calls from there are
    // then ordered by CUDA with no events (two record/wait pairs less per call).
    setup.owned_stream = detail::CudaStream::create(config.device_id, detail::StreamSync::kWithLegacyStream);
    setup.stream = setup.owned_stream->handle();
    setup.stream_syncs_with_legacy = true;
    options["user_compute_stream"] = std::to_string(setup.stream);
  }
  options["has_user_compute_stream"] = "1";
  ort_call(ErrorCode::kInvalidArgument, "CUDA provider options",
           [&] { setup.options.AppendExecutionProvider_V2(*rt.env, {device}, options); });
  setup.memory_info = device.GetMemoryInfo(OrtDeviceMemoryType_DEFAULT);
  setup.pinned_memory_info = device.GetMemoryInfo(OrtDeviceMemoryType_HOST_ACCESSIBLE);
}

bool truthy(const std::string& value) { return value == "1" || value == "true" || value == "True"; }

TritonProviderBlock triton_cuda(const OnnxSessionConfig& config, const std::map<std::string, std::string>&) {
  TritonProviderBlock block;
  block.accelerator_name = "cuda";
  auto& notes = block.notes;
  for (const auto& [key, value] : config.provider_options) {
    if (auto why = detail::triton_process_local_option(key, value)) {
      notes.push_back(*why);
    } else if (key == "enable_cuda_graph") {
      if (truthy(value))
        notes.push_back(
            "provider option enable_cuda_graph=" + value +
            ": not expressible. Triton's ONNX Runtime backend binds each request's own buffers, while ONNX "
            "Runtime replays a captured CUDA graph on the addresses of the run that captured it (aitune "
            "copies into fixed buffers for this); optimization.cuda.graphs is read only by Triton's "
            "TensorRT backend. The model runs without CUDA graphs");
    } else if (key == "cudnn_conv_algo_search") {
      // The backend resets these four whenever the model has `parameters`; as model
      // parameters (its older spelling) they hold in every case.
      static const std::map<std::string, std::string> codes = {{"EXHAUSTIVE", "0"}, {"HEURISTIC", "1"}, {"DEFAULT", "2"}};
      auto code = codes.find(value);
      if (code == codes.end())
        notes.push_back("provider option cudnn_conv_algo_search=" + value + ": not a value Triton takes");
      else
        block.parameters[key] = code->second;
    } else if (key == "arena_extend_strategy") {
      static const std::map<std::string, std::string> codes = {
          {"kNextPowerOfTwo", "0"}, {"kSameAsRequested", "1"}, {"0", "0"}, {"1", "1"}};
      auto code = codes.find(value);
      if (code == codes.end())
        notes.push_back("provider option arena_extend_strategy=" + value + ": not a value Triton takes");
      else
        block.parameters[key] = code->second;
    } else if (key == "gpu_mem_limit" || key == "do_copy_in_default_stream") {
      block.parameters[key] = value;
    } else {
      block.accelerator[key] = value;  // the "cuda" accelerator hands every other key to the CUDA provider
    }
  }
  return block;
}

}  // namespace

ProviderDescription cuda() {
  ProviderDescription d;
  d.name = "cuda";
  d.ort_name = "CUDAExecutionProvider";
  d.capabilities = {.device_memory = true, .cuda_graph = true, .fp16_model = true, .contrib_operators = true};
  d.option_names = {"use_tf32", "cudnn_conv_algo_search", "prefer_nhwc", "fuse_conv_bias", "enable_cuda_graph",
                    "gpu_mem_limit", "arena_extend_strategy", "do_copy_in_default_stream", "user_compute_stream"};
  d.variants = [](const OnnxSessionConfig&, const GraphSpec& spec) {
    // The CUDA EP defaults to TF32 matmuls and convolutions; eager fp32 does not.
    std::vector<ProviderVariant> out{
        {{{"use_tf32", "0"}}, Precision::kStrict, {}, {}},
        {{{"use_tf32", "0"}, {"cudnn_conv_algo_search", "HEURISTIC"}}, Precision::kStrict, {}, {}},
        {{{"use_tf32", "0"}, {"prefer_nhwc", "1"}}, Precision::kStrict, {}, {}},
        {{{"use_tf32", "1"}}, Precision::kTF32, {}, {}},
    };
    // CUDA graphs for static shapes: one replay instead of a launch per kernel, what
    // small models at batch 1 are bound by. (Dynamic specs would capture a graph per
    // shape seen.) ORT refuses capture for models it cannot capture: the candidate
    // then fails with ORT's reason and the others are chosen from.
    if (std::all_of(spec.inputs.begin(), spec.inputs.end(),
                    [](const TensorSpec& t) { return t.min_shape == t.max_shape; })) {
      out.push_back({{{"use_tf32", "0"}, {"enable_cuda_graph", "1"}}, Precision::kStrict, {}, {}});
      out.push_back({{{"use_tf32", "1"}, {"enable_cuda_graph", "1"}}, Precision::kTF32, {}, {}});
    }
    return out;
  };
  d.fixed_precision = [](const std::map<std::string, std::string>& options) -> std::optional<Precision> {
    // A caller-fixed use_tf32 decides the precision, not the variant.
    if (auto it = options.find("use_tf32"); it != options.end())
      return it->second == "0" ? Precision::kStrict : Precision::kTF32;
    return std::nullopt;
  };
  d.probe = [](OrtRuntime::Impl& runtime) { return runtime.probe_cuda(); };
  d.append = append_cuda;
  d.doctor_details = [](const ProviderStatus& status) { return status.cuda_libraries; };
  d.triton = triton_cuda;
  return d;
}

}  // namespace aitune::providers
