// Private to the CLI: the ranges every number on the command line must fall in, their
// CLI11 validators, and the mapping of model output names to safe file names.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <string>

#include "aitune/onnx_session.hpp"

namespace aitune::cli {

/// Ranges of the command line's numbers (stated in --help and in the error messages).
inline constexpr int kMaxDeviceId = 1023;
inline constexpr int64_t kMaxExtent = (int64_t{1} << 31) - 1;   ///< a --dim value or batch size
inline constexpr int64_t kMaxBatchSize = int64_t{1} << 20;      ///< --batch-sizes, --max-batch-size
inline constexpr int kMaxIterations = 10'000'000;               ///< --iterations, --warmup
inline constexpr double kMaxTimeCapS = 86'400;                  ///< --time-cap: a day
inline constexpr int64_t kMaxRandomInputBytes = int64_t{1} << 30;  ///< one random input: 1 GiB

/// A CLI11 check: a finite number in [lo, hi] (CLI::Range lets NaN through).
CLI::Validator finite_in(double lo, double hi);

/// A CLI11 check: a path that is not empty (`--checkpoint ""`, an unset shell variable,
/// was taken as the option left out: the tune ran and nothing was written, exit 0).
CLI::Validator non_empty_path();

/// Moves the session's own settings given as --provider-option (intra_op_threads,
/// inter_op_threads, graph_optimization_level: what the CPU provider's refusal of options
/// names) from `options` into `config`; Error(kInvalidArgument) for a value out of range.
void take_session_options(std::map<std::string, std::string>& options, OnnxSessionConfig& config);

/// `text` as an integer in [lo, hi]; Error(kInvalidArgument) "<what>: ..." otherwise
/// (not an integer, too many digits, out of range).
int64_t parse_integer(const std::string& text, int64_t lo, int64_t hi, const std::string& what);

/// A file name for the model output `name` that stays inside the directory it is
/// joined to: [A-Za-z0-9_.-] are kept, every other byte becomes %XX (a leading '.'
/// too, so "..", "." and hidden names cannot appear), distinct names give distinct
/// file names; ".npy" is appended. Error(kInvalidArgument) for a name whose file name
/// would exceed 255 bytes.
std::string output_file_name(const std::string& name);

/// Error(kIo) "cannot write <what> to '<path>': ..." where `path` is a directory or its
/// directory does not exist: checked before the work whose result it would hold (a tune's
/// --report, debug-precision's --json), not after it.
void check_output_file(const std::string& path, const std::string& what);

}  // namespace aitune::cli
