// SessionContext: stream ordering decisions and adoption of ORT-allocated outputs, shared by the runners.
#include "session/session_context.hpp"

namespace aitune::detail {
namespace {

// Owner of a tensor ORT allocated: members are destroyed in reverse order, so the value
// is released before the session it came from.
struct OrtTensorOwner {
  std::shared_ptr<Ort::Session> session;
  Ort::Value value{nullptr};
};

}  // namespace

Ort::RunOptions quiet_run_options() {
  Ort::RunOptions options;
  options.SetRunLogSeverityLevel(ORT_LOGGING_LEVEL_FATAL);
  return options;
}

bool SessionContext::needs_events(std::optional<std::uintptr_t> caller) const {
  if (!caller || stream == 0 || *caller == stream) return false;
  // 0 and cudaStreamLegacy (1) name the legacy default stream.
  return !(stream_syncs_with_legacy && *caller <= 1);
}

std::vector<Tensor> SessionContext::adopt_outputs(std::vector<Ort::Value> values) const {
  std::vector<Tensor> result;
  result.reserve(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    auto owner = std::make_shared<OrtTensorOwner>();
    owner->session = session;
    owner->value = std::move(values[i]);
    auto info = owner->value.GetTensorTypeAndShapeInfo();
    TensorView view;
    view.dtype = outputs[i].dtype;
    view.shape = info.GetShape();
    view.device = device;
    view.data = owner->value.GetTensorMutableRawData();
    result.push_back(Tensor::adopt(std::move(view), std::move(owner)));
  }
  return result;
}

std::vector<Ort::Value> SessionContext::aliased_outputs(const std::vector<TensorView>& views) const {
  std::vector<Ort::Value> values;
  values.reserve(outputs.size());
  for (const int input : output_aliases)
    values.push_back(input < 0 ? Ort::Value{nullptr} : value_over(views[static_cast<std::size_t>(input)], memory_info));
  return values;
}

Tensor SessionContext::caller_buffer(const TensorView& input) const {
  // A non-null owner that owns nothing: Tensor::defined() is true, the memory is the caller's.
  return Tensor::adopt(TensorView{input.data, input.dtype, input.shape, {}, input.device}, std::make_shared<int>(0));
}

Ort::Value value_over(const TensorView& v, const OrtMemoryInfo* mem) {
  return Ort::Value::CreateTensor(Ort::ConstMemoryInfo(mem), v.data, v.nbytes(), v.shape.data(), v.shape.size(),
                                  static_cast<ONNXTensorElementDataType>(dtype_to_onnx(v.dtype)));
}

}  // namespace aitune::detail
