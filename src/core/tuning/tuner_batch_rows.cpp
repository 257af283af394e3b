// Whether the winner of a tune computes the rows of a batch apart from each other: each
// row of the largest recorded batch against that row run alone. A server joins requests
// into one call only where they are (serving_batches.cpp); a model whose outputs mix rows
// would otherwise hand each request a part of the others' answers.
#include <cstring>

#include "aitune/valid_positions.hpp"
#include "tuning/tuner_impl.hpp"

namespace aitune {
using namespace detail;

namespace {

// Row `index` of a contiguous host tensor along `axis`, as a tensor of extent 1 there.
Tensor row_along_axis(const TensorView& tensor, int axis, int64_t index) {
  Shape shape = tensor.shape;
  const auto a = static_cast<std::size_t>(axis);
  const int64_t extent = shape[a];
  shape[a] = 1;
  Tensor out = Tensor::empty_host(tensor.dtype, shape);
  std::size_t outer = 1, inner = dtype_size(tensor.dtype);
  for (std::size_t i = 0; i < tensor.shape.size(); ++i)
    if (i < a) outer *= static_cast<std::size_t>(tensor.shape[i]);
    else if (i > a) inner *= static_cast<std::size_t>(tensor.shape[i]);
  const auto* src = static_cast<const char*>(tensor.data);
  auto* dst = static_cast<char*>(out.data());
  for (std::size_t o = 0; o < outer; ++o, dst += inner)
    std::memcpy(dst, src + (o * static_cast<std::size_t>(extent) + static_cast<std::size_t>(index)) * inner, inner);
  return out;
}

}  // namespace

std::pair<BatchRows, std::string> GraphTuner::Impl::check_batch_rows(std::size_t index) {
  const auto& sample = samples[profile_sample];
  const auto& map = input_maps[index];
  const GraphSpec model_spec = spec_for(map);
  if (std::none_of(model_spec.inputs.begin(), model_spec.inputs.end(),
                   [](const TensorSpec& t) { return t.batch_axis; }))
    return {BatchRows::kUnchecked, "the graph has no batch axis"};
  for (const auto& output : model_spec.outputs)
    if (!output.batch_axis)
      return {BatchRows::kCoupled,
              "output '" + output.name + "' has no batch axis, so a call's outputs cannot be split per request"};
  if (sample.batch_size < 2)
    return {BatchRows::kUnchecked, "no recorded batch of 2 or more samples to compare rows in"};
  OnnxSession& backend = *backends[index];
  const auto& candidate = report.candidates[index];
  try {
    std::vector<Tensor> host_inputs;
    for (const auto& v : select(sample.inputs, map)) host_inputs.push_back(backend.to_host(borrowed(v)));
    auto run = [&](const std::vector<Tensor>& host) {
      std::vector<Tensor> device;
      for (const auto& t : host) device.push_back(backend.to_device(t));
      return host_outputs(backend, backend.infer(views_of(device)));
    };
    const auto batched = run(host_inputs);
    // The first and the last row: a batch-wide reduction or a row-against-row product shows
    // in any row, and two rows catch an output that tells rows apart by their position.
    for (const int64_t row : {int64_t{0}, sample.batch_size - 1}) {
      std::vector<Tensor> alone_inputs;
      for (std::size_t i = 0; i < host_inputs.size(); ++i) {
        const auto& axis = model_spec.inputs[i].batch_axis;
        alone_inputs.push_back(axis ? row_along_axis(host_inputs[i].view(), *axis, row) : host_inputs[i]);
      }
      const auto alone = run(alone_inputs);
      std::vector<Tensor> expected;
      std::vector<TensorView> masks;
      for (std::size_t o = 0; o < batched.size(); ++o) {
        const int axis = *model_spec.outputs[o].batch_axis;
        expected.push_back(row_along_axis(batched[o].view(), axis, row));
        if (alone[o].shape() != expected.back().shape())
          return {BatchRows::kCoupled, "output '" + output_names[o] + "' of row " + std::to_string(row) + " is " +
                                           shape_to_string(alone[o].shape()) + " alone but " +
                                           shape_to_string(expected.back().shape()) + " in a batch of " +
                                           std::to_string(sample.batch_size)};
      }
      // Positions the model leaves undefined (padding) stay out, the mask's row with its output's.
      // (A mask it cannot take a row of compares every position: at worst a false "coupled",
      // which serves requests apart.)
      std::vector<Tensor> mask_rows;
      ValidPositions valid;
      if (!sample.valid.empty()) {
        std::vector<TensorView> rows;
        for (std::size_t o = 0; o < sample.valid.masks.size() && o < batched.size(); ++o) {
          const auto& m = sample.valid.masks[o];
          const bool sliceable = m.data && m.device.kind == DeviceKind::kCPU && m.is_contiguous() &&
                                 !m.shape.empty() && m.shape[0] == sample.batch_size &&
                                 *model_spec.outputs[o].batch_axis == 0;
          if (sliceable) mask_rows.push_back(row_along_axis(m, 0, row));
          rows.push_back(sliceable ? mask_rows.back().view() : TensorView{});
        }
        valid = ValidPositions(std::move(rows), sample.valid.source);
      }
      const auto check = compare_sample_at_valid_positions(
          "row " + std::to_string(row), output_names, views_of(alone), views_of(expected), valid,
          tolerances_for(candidate.precision));
      if (!check.passed()) {
        for (const auto& o : check.outputs)
          if (!o.passed)
            return {BatchRows::kCoupled, "output '" + o.name + "' of row " + std::to_string(row) + " of a batch of " +
                                             std::to_string(sample.batch_size) + " differs from that row alone (" +
                                             o.failure + ")"};
      }
    }
  } catch (const std::exception& e) {
    // A graph that refuses a row alone (its batch range starts above 1) cannot be checked;
    // nor one whose run fails here (out of memory): its requests are then served apart.
    return {BatchRows::kUnchecked, std::string("a row alone could not be run: ") + e.what()};
  }
  return {BatchRows::kIndependent, "each row of a batch of " + std::to_string(sample.batch_size) +
                                       " equals that row computed alone"};
}

}  // namespace aitune
