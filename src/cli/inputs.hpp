// Private to the CLI: what `run` and `tune` share: NAME=VALUE options, random inputs,
// provider selection, samples read from .npy files.
#pragma once

#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "aitune/execution_provider.hpp"
#include "aitune/graph_spec.hpp"
#include "aitune/onnx_session.hpp"
#include "aitune/tensor.hpp"

namespace aitune::cli {

/// "NAME=VALUE" -> {NAME, VALUE}, split at the first '='; Error(kInvalidArgument)
/// naming `what` otherwise.
std::pair<std::string, std::string> split_assignment(const std::string& text, const char* what);

/// Repeated "KEY=VALUE" options (--provider-option) as a map; Error(kInvalidArgument) naming
/// `what` and both values where a key is given twice (a map kept the first silently).
std::map<std::string, std::string> assignments(const std::vector<std::string>& given, const char* what);

/// "NAME=VALUE" where NAME is one of `names` and may itself contain '=' (tensor names
/// of exported models do): split at the '=' whose left part is one of `names`. None:
/// Error(kInvalidArgument) listing `names`; several (names "a" and "a=b" both fit):
/// Error(kInvalidArgument) listing the readings.
std::pair<std::string, std::string> split_named_assignment(const std::string& text, const char* what,
                                                           const std::vector<std::string>& names,
                                                           const char* kind);

/// The --input NAME=FILE options of `run` and `debug-precision`: each .npy FILE read, by
/// the model input NAME it gives (NAME one of `inputs`, which may contain '='; see
/// split_named_assignment). Error(kInvalidArgument) for an input given twice (the later
/// file would silently replace the earlier one).
std::map<std::string, Tensor> load_input_files(const std::vector<std::string>& specs,
                                               const std::vector<IoInfo>& inputs);

/// --dim SYMBOL=VALUE options as a map; Error(kInvalidArgument) for a SYMBOL that is no
/// symbolic dimension of `inputs` or a VALUE that is not an integer in [1, kMaxExtent].
std::map<std::string, int64_t> parse_dims(const std::vector<std::string>& dims, const std::vector<IoInfo>& inputs);

/// `dims` with each symbolic extent that a `given` input fixes (a file of batch 3 fixes
/// its model input's `b` to 3), so random inputs sharing the symbol match it (they were made
/// at the smallest extent, and the run failed inside ONNX Runtime). Error(kInvalidArgument)
/// where two given inputs, or a given input and a --dim, disagree on a symbol; `given_as`
/// names a given input in it ("--input x", or a sample's "x.npy").
std::map<std::string, int64_t> dims_with_given(std::map<std::string, int64_t> dims,
                                               const std::map<std::string, Tensor>& given,
                                               const std::vector<IoInfo>& inputs,
                                               const std::string& given_as = "--input ",
                                               const std::string& given_after = "");

/// A host tensor with reproducible values every dtype can hold. A symbolic extent takes
/// its `dims` value, else the smallest `spec` accepts (1 without a spec).
/// Error(kInvalidArgument) when it would exceed kMaxRandomInputBytes.
Tensor random_input(const IoInfo& io, const TensorSpec* spec, const std::map<std::string, int64_t>& dims,
                    std::mt19937& rng);

/// "auto" -> CUDA where its provider loads, else CPU (and says so); else the named provider.
ExecutionProvider resolve_provider(const std::string& text);

/// The samples of `aitune tune --samples DIR`: DIR holds NAME.npy per model input (one
/// sample), or subdirectories that each do (one sample each, in name order). Every
/// sample must name exactly the model's inputs (Error(kInvalidArgument) listing them).
/// Every file read lies inside DIR: an input whose name would make its file path leave
/// DIR (an absolute name, "..", a path through a symbolic link that leads out) is
/// Error(kInvalidArgument) naming the input and the path.
std::vector<std::map<std::string, Tensor>> load_sample_dir(const std::string& dir,
                                                            const std::vector<IoInfo>& inputs);

}  // namespace aitune::cli
