// Serving: the batching plan from measurements, and request checks and grouping for a served graph.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "aitune/error.hpp"
#include "aitune/serving_batches.hpp"
#include "aitune/serving_plan.hpp"
#include "bindings.hpp"

namespace nb = nanobind;

namespace aitune::python {

void bind_serving(nb::module_& m) {
  nb::class_<BatchLatency>(m, "BatchLatency", "Latency of one call at one batch size (microseconds).")
      .def(
          "__init__",
          [](BatchLatency* self, int64_t batch_size, double p50_us, double p99_us, std::string source) {
            new (self) BatchLatency{batch_size, p50_us, p99_us, std::move(source)};
          },
          nb::arg("batch_size"), nb::arg("p50_us"), nb::arg("p99_us") = 0.0, nb::arg("source") = "")
      .def_rw("batch_size", &BatchLatency::batch_size)
      .def_rw("p50_us", &BatchLatency::p50_us)
      .def_rw("p99_us", &BatchLatency::p99_us)
      .def_rw("source", &BatchLatency::source)
      .def("__repr__", [](const BatchLatency& b) {
        return "BatchLatency(batch=" + std::to_string(b.batch_size) + ", p50_us=" + std::to_string(b.p50_us) +
               ", p99_us=" + std::to_string(b.p99_us) + ")";
      });

  nb::class_<ServingObjective>(m, "ServingObjective", "What the user asks of the server.")
      .def(
          "__init__",
          [](ServingObjective* self, std::optional<double> slo_ms, double overhead_ms, int64_t max_batch_accepted,
             std::string apart_reason) {
            new (self) ServingObjective{slo_ms, overhead_ms, max_batch_accepted, std::move(apart_reason)};
          },
          nb::arg("slo_ms").none() = nb::none(), nb::arg("overhead_ms") = 2.0, nb::arg("max_batch_accepted") = 0,
          nb::arg("apart_reason") = "")
      .def_rw("slo_ms", &ServingObjective::slo_ms)
      .def_rw("overhead_ms", &ServingObjective::overhead_ms)
      .def_rw("max_batch_accepted", &ServingObjective::max_batch_accepted)
      .def_rw("apart_reason", &ServingObjective::apart_reason);

  nb::class_<ServingPlan>(m, "ServingPlan", "The batching a deployment is given, with why.")
      .def_ro("max_batch_size", &ServingPlan::max_batch_size)
      .def_ro("batch_wait_timeout_s", &ServingPlan::batch_wait_timeout_s)
      .def_ro("expected_p99_ms", &ServingPlan::expected_p99_ms)
      .def_ro("expected_throughput", &ServingPlan::expected_throughput)
      .def_ro("objective_met", &ServingPlan::objective_met)
      .def_ro("measured", &ServingPlan::measured)
      .def_ro("reasons", &ServingPlan::reasons)
      .def("explain", &ServingPlan::explain)
      .def("to_json", &ServingPlan::to_json, nb::arg("indent") = 2);

  m.def("batch_latencies_from_report", &batch_latencies_from_report, nb::arg("report_json"));
  m.def("plan_serving", &plan_serving, nb::arg("measured"), nb::arg("objective"));

  // Requests cross as (name, dtype name, shape) tuples: a dtype aitune has no name for is
  // refused as that input's dtype mismatch.
  m.def(
      "check_request",
      [](const GraphSpec& spec, const std::vector<std::tuple<std::string, std::string, Shape>>& request) {
        std::vector<RequestTensor> tensors;
        for (const auto& [name, dtype, shape] : request) {
          DType parsed;
          try {
            parsed = dtype_from_name(dtype);
          } catch (const Error&) {
            auto index = spec.find_input(name);
            throw Error(ErrorCode::kDTypeMismatch,
                        "input '" + name + "' is " + dtype + ", which aitune does not serve" +
                            (index ? "; the graph takes " + spec.inputs[*index].to_string() : std::string()));
          }
          tensors.push_back({name, parsed, shape});
        }
        return check_request(spec, tensors);
      },
      nb::arg("spec"), nb::arg("request"));
  m.def("request_batch_size", &request_batch_size, nb::arg("spec"), nb::arg("shapes"));
  m.def("requests_apart_reason", &requests_apart_reason, nb::arg("spec"),
        "Why requests to the graph may not share a call (\"\" where its batch rows were found independent).");
  m.def(
      "group_requests",
      [](const GraphSpec& spec, const std::vector<std::vector<Shape>>& requests,
         const std::vector<nb::bytes>& unbatched_values) {
        std::vector<std::string> values;
        values.reserve(unbatched_values.size());
        for (const auto& b : unbatched_values) values.emplace_back(b.c_str(), b.size());
        return group_requests(spec, requests, values);
      },
      nb::arg("spec"), nb::arg("requests"), nb::arg("unbatched_values"));
}

}  // namespace aitune::python
