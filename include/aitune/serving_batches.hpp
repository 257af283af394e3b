// Requests to a served graph: each checked against the graph spec on its own (so a bad
// one is refused alone), then grouped into model calls along the graph's batch axes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "aitune/dtype.hpp"
#include "aitune/graph_spec.hpp"
#include "aitune/tensor.hpp"

namespace aitune {

/// One named tensor of a request, as the client sent it.
struct RequestTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
};

/// Checks a request's tensors against `spec`: every input present once, no other names,
/// each tensor's dtype, rank and extents within the spec, and one batch size across the
/// inputs that have a batch axis. Returns, per spec input, the index of its tensor in
/// `request`. Throws Error(kInvalidArgument) for a missing, repeated or unknown name or
/// disagreeing batch sizes, Error(kDTypeMismatch) / Error(kShapeMismatch) naming the
/// input, what was sent and what the graph accepts.
std::vector<std::size_t> check_request(const GraphSpec& spec, const std::vector<RequestTensor>& request);

/// Why requests to `spec`'s graph may not share a call, with what to do about it; "" where
/// the tuner found its batch rows independent (GraphSpec::batch_rows). What group_requests
/// decides by, and what a serving plan and a Triton export say.
std::string requests_apart_reason(const GraphSpec& spec);

/// Batch size of a checked request (shapes in spec input order): the extent of the batch
/// axis; 0 when the graph has no batch axis.
int64_t request_batch_size(const GraphSpec& spec, const std::vector<Shape>& shapes);

/// Groups checked requests (shapes in spec input order) into model calls: requests whose
/// extents agree on every axis but the batch axis, and whose inputs without a batch axis
/// hold the same values, go into one call, in arrival order, split so that no call's
/// summed batch exceeds the batch axis' upper bound. `unbatched_values` holds, per
/// request, the bytes of its inputs that have no batch axis (in spec input order): such an
/// input is one value for the whole call (a timestep, a scale), so requests that sent other
/// values run apart. A graph without a batch axis, or whose batch rows were not found
/// independent by the tuner (spec.batch_rows != BatchRows::kIndependent), serves each
/// request in a call of its own.
/// Returns the requests' indices per call. Throws Error(kInvalidArgument) when
/// `unbatched_values` does not hold one entry per request.
std::vector<std::vector<std::size_t>> group_requests(const GraphSpec& spec,
                                                     const std::vector<std::vector<Shape>>& requests,
                                                     const std::vector<std::string>& unbatched_values);

}  // namespace aitune
