// Private: where ONNX Runtime and the CUDA libraries of its GPU providers are found on
// disk: the PyPI wheel's layout (onnxruntime/capi, *.dist-info, nvidia/*/lib) and the
// preloading of CUDA / cuDNN libraries that onnxruntime's own preload_dlls does in Python.
#pragma once

#include <string>
#include <vector>

#include "aitune/ort_runtime.hpp"

namespace aitune::detail {

/// The newest `libonnxruntime.so.1*` in `capi_dir` (the wheel ships
/// libonnxruntime.so.1.<minor>.<patch> with no symlink); "" when there is none.
std::string ort_library_in(const std::string& capi_dir);

/// The wheel `library` (a loaded libonnxruntime) belongs to, if it sits in
/// `<site-packages>/onnxruntime/capi`: distribution and version from the `*.dist-info`
/// folders beside the package. All fields empty otherwise.
OrtWheel wheel_of_library(const std::string& library);

/// `<site-packages>/nvidia/*/lib` beside the wheel whose capi folder is `capi_dir`, sorted.
std::vector<std::string> nvidia_library_dirs_beside(const std::string& capi_dir);

/// The CUDA / cuDNN libraries (by soname) that the CUDA 13 build of the GPU providers
/// links, in the order they must load (cuBLASLt before cuBLAS, ...).
const std::vector<std::string>& cuda_library_sonames();

/// dlopens (RTLD_GLOBAL, never closed) each of cuda_library_sonames() that is not yet in
/// the process from the first of `dirs` holding it, so that a provider's DT_NEEDED entries
/// resolve to them; returns one line per library that failed to load ("path: why").
std::vector<std::string> preload_cuda_libraries(const std::vector<std::string>& dirs);

/// "soname: path" for each of cuda_library_sonames() (and the driver, libcuda.so.1) that
/// is in the process now.
std::vector<std::string> loaded_cuda_libraries();

}  // namespace aitune::detail
