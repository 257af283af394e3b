// Private to the extension: one registration function per bound concept.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>

#include "aitune/tensor.hpp"

namespace aitune::python {

void bind_errors(nanobind::module_& m);
void bind_types(nanobind::module_& m);        // ExecutionProvider, GraphOptimizationLevel
void bind_graph_spec(nanobind::module_& m);   // TensorSpec, GraphSpec, GraphSpecBuilder
void bind_runtime(nanobind::module_& m);      // OrtRuntime, ProviderStatus
void bind_session(nanobind::module_& m);      // OnnxSessionConfig, OnnxSession
void bind_checkpoint(nanobind::module_& m);   // Checkpoint, CheckpointManifest/Graph/Artifact, overrides
void bind_cli(nanobind::module_& m);          // cli_main
void bind_process_directory(nanobind::module_& m);  // OwnedDirectory, stale-directory sweeps, default_cache_root
void bind_tuning(nanobind::module_& m);       // correctness, profiler, strategies, GraphTuner
void bind_torch_dispatch(nanobind::module_& m);  // TorchDispatch: the torch front end's C++ half (frontend/)
void bind_triton(nanobind::module_& m);       // export_triton, TritonExportOptions/Result
void bind_serving(nanobind::module_& m);      // plan_serving, check_request, group_requests

/// Any Python array (torch tensor, numpy array, anything with __dlpack__).
using AnyArray = nanobind::ndarray<nanobind::ro>;
/// A non-owning view of `array`; errors name `name`. The caller keeps `array` alive.
TensorView view_of(const AnyArray& array, const std::string& name);
/// `tensor` as a "dltensor" DLPack capsule, without a copy; the capsule keeps it alive.
nanobind::object to_dlpack_capsule(const Tensor& tensor);

}  // namespace aitune::python
