// Private to the extension: one registration function per bound concept.
#pragma once

#include <nanobind/nanobind.h>

namespace aitune::python {

void bind_errors(nanobind::module_& m);
void bind_types(nanobind::module_& m);        // ExecutionProvider, GraphOptimizationLevel
void bind_graph_spec(nanobind::module_& m);   // TensorSpec, GraphSpec, GraphSpecBuilder
void bind_runtime(nanobind::module_& m);      // OrtRuntime, ProviderStatus
void bind_backend(nanobind::module_& m);      // OnnxRuntimeBackendConfig, OnnxRuntimeBackend
void bind_cli(nanobind::module_& m);          // cli_main

}  // namespace aitune::python
