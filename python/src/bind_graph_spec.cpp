// TensorSpec / GraphSpec / GraphSpecBuilder; dtypes cross as their names ("float32").
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "aitune/graph_spec.hpp"
#include "bindings.hpp"

namespace nb = nanobind;

namespace aitune::python {
namespace {

using RecordTuple = std::tuple<std::string, std::string, std::vector<int64_t>>;

std::vector<TensorRecord> to_records(const std::vector<RecordTuple>& tuples) {
  std::vector<TensorRecord> records;
  records.reserve(tuples.size());
  for (const auto& [name, dtype, shape] : tuples) records.push_back({name, dtype_from_name(dtype), shape});
  return records;
}

}  // namespace

void bind_graph_spec(nb::module_& m) {
  nb::class_<TensorSpec>(m, "TensorSpec", "One graph input or output: dtype and per-axis extent range.")
      .def(nb::init<>())
      .def_rw("name", &TensorSpec::name)
      .def_prop_rw(
          "dtype", [](const TensorSpec& s) { return std::string(dtype_name(s.dtype)); },
          [](TensorSpec& s, const std::string& d) { s.dtype = dtype_from_name(d); })
      .def_rw("min_shape", &TensorSpec::min_shape)
      .def_rw("max_shape", &TensorSpec::max_shape)
      .def_rw("batch_axis", &TensorSpec::batch_axis)
      .def_rw("step", &TensorSpec::step)
      .def("step_of", &TensorSpec::step_of, nb::arg("axis"))
      .def("dynamic_axes", &TensorSpec::dynamic_axes)
      .def("accepts", &TensorSpec::accepts, nb::arg("shape"))
      .def("__eq__", [](const TensorSpec& a, const TensorSpec& b) { return a == b; })
      .def("__repr__", [](const TensorSpec& s) { return "TensorSpec(" + s.name + ": " + s.to_string() + ")"; });

  nb::class_<ShapeCondition>(m, "ShapeCondition",
                             "A condition on input extents an exported graph holds only under (a branch of the "
                             "model's code on a shape that the export recorded one side of).")
      .def_static("from_json", &ShapeCondition::from_json, nb::arg("text"))
      .def("to_json", &ShapeCondition::to_json)
      .def("holds", nb::overload_cast<const GraphSpec&, const std::vector<Shape>&>(&ShapeCondition::holds, nb::const_),
           nb::arg("spec"), nb::arg("shapes"),
           "Whether it holds for these input shapes (in the spec's input order).")
      .def_prop_ro("inputs", &ShapeCondition::inputs)
      .def("__str__", &ShapeCondition::to_string)
      .def("__repr__", [](const ShapeCondition& c) { return "ShapeCondition(" + c.to_string() + ")"; })
      .def("__eq__", [](const ShapeCondition& a, const ShapeCondition& b) { return a == b; });

  nb::class_<GraphSpec>(m, "GraphSpec", "Inputs and outputs of one graph, derived from recorded calls.")
      .def(nb::init<>())
      .def_rw("inputs", &GraphSpec::inputs)
      .def_rw("outputs", &GraphSpec::outputs)
      .def_rw("batch_sizes", &GraphSpec::batch_sizes)
      .def_rw("conditions", &GraphSpec::conditions)
      .def_prop_rw(
          "batch_rows", [](const GraphSpec& s) { return std::string(batch_rows_name(s.batch_rows)); },
          [](GraphSpec& s, const std::string& name) { s.batch_rows = parse_batch_rows(name); },
          "'independent' (each row of a batch computed as it is alone: requests may share a call), 'coupled' "
          "or 'unchecked', as the tuner found it")
      .def_rw("batch_rows_reason", &GraphSpec::batch_rows_reason)
      .def("violated_condition",
           [](const GraphSpec& s, const std::vector<Shape>& shapes) -> std::optional<ShapeCondition> {
             const ShapeCondition* c = s.violated_condition(shapes);
             return c ? std::optional<ShapeCondition>(*c) : std::nullopt;
           },
           nb::arg("shapes"), "The first condition these input shapes violate, or None.")
      .def("to_json", &GraphSpec::to_json, nb::arg("indent") = 2)
      .def_static("from_json", &GraphSpec::from_json, nb::arg("text"))
      .def("__eq__", [](const GraphSpec& a, const GraphSpec& b) { return a == b; });

  nb::class_<GraphSpecBuilder>(m, "GraphSpecBuilder", "Accumulates recorded calls and derives a GraphSpec.")
      .def(nb::init<>())
      .def(
          "record",
          [](GraphSpecBuilder& b, const std::vector<RecordTuple>& inputs, const std::vector<RecordTuple>& outputs,
             int64_t batch_size) { b.record(to_records(inputs), to_records(outputs), batch_size); },
          nb::arg("inputs"), nb::arg("outputs"), nb::arg("batch_size"),
          "inputs/outputs: lists of (name, dtype name, shape); batch_size <= 0 for none.")
      .def_prop_ro("num_samples", &GraphSpecBuilder::num_samples)
      .def("declare_range", &GraphSpecBuilder::declare_range, nb::arg("input"), nb::arg("axis"), nb::arg("min"),
           nb::arg("max"), nb::arg("step") = 1,
           "A range the user declared for an input axis (max -1: unbounded; extents min, min + step, ...); "
           "build() applies it.")
      .def("build", &GraphSpecBuilder::build);
}

}  // namespace aitune::python
