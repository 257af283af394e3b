// Inputs of the CLI's subcommands: NAME=VALUE options, random tensors, .npy samples.
#include "inputs.hpp"

#include <set>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "aitune/error.hpp"
#include "aitune/npy.hpp"
#include "aitune/ort_runtime.hpp"
#include "arguments.hpp"

namespace aitune::cli {

std::pair<std::string, std::string> split_assignment(const std::string& text, const char* what) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + " '" + text + "' is not of the form NAME=VALUE");
  return {text.substr(0, eq), text.substr(eq + 1)};
}

std::map<std::string, std::string> assignments(const std::vector<std::string>& given, const char* what) {
  std::map<std::string, std::string> out;
  for (const auto& text : given) {
    auto [key, value] = split_assignment(text, what);
    if (auto [it, fresh] = out.emplace(key, value); !fresh)
      throw Error(ErrorCode::kInvalidArgument, std::string(what) + " " + key + " is given twice ('" + it->second +
                                                   "' and '" + value + "'): give it once");
  }
  return out;
}

std::pair<std::string, std::string> split_named_assignment(const std::string& text, const char* what,
                                                           const std::vector<std::string>& names,
                                                           const char* kind) {
  std::vector<std::size_t> fits;
  for (auto eq = text.find('='); eq != std::string::npos; eq = text.find('=', eq + 1))
    if (eq + 1 < text.size() && std::find(names.begin(), names.end(), text.substr(0, eq)) != names.end())
      fits.push_back(eq);
  std::string listed;
  for (const auto& n : names) listed += (listed.empty() ? "'" : ", '") + n + "'";
  if (fits.empty()) {
    // `--input x` names an input and lacks its value: said so, not "NAME one of: 'x'"
    const std::string name = text.substr(0, text.find('='));
    if (std::find(names.begin(), names.end(), name) != names.end())
      throw Error(ErrorCode::kInvalidArgument, std::string(what) + " '" + text + "' gives '" + name +
                                                   "' no value: write " + std::string(what) + " " + name + "=VALUE");
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + " '" + text + "' is not of the form NAME=VALUE with NAME one of the " +
                                                 kind + ": " + (listed.empty() ? "none" : listed));
  }
  if (fits.size() > 1) {
    std::string readings;
    for (auto eq : fits) readings += (readings.empty() ? "'" : ", '") + text.substr(0, eq) + "'";
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + " '" + text + "' is ambiguous: its NAME may be " +
                                                 readings + "; only one reading may name one of the " + kind);
  }
  return {text.substr(0, fits[0]), text.substr(fits[0] + 1)};
}

// Fills a host tensor with reproducible values in a range every dtype can hold. A
// symbolic extent takes its --dim value, else the smallest the graph spec accepts.
Tensor random_input(const IoInfo& io, const TensorSpec* spec, const std::map<std::string, int64_t>& dims,
                    std::mt19937& rng) {
  Shape shape = io.shape;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] >= 0) continue;
    auto it = dims.find(io.symbolic_dims[i]);
    shape[i] = it != dims.end() ? it->second
               : spec && i < spec->rank() ? std::max<int64_t>(spec->min_shape[i], 1)
                                          : 1;
  }
  // Bound the allocation before making it: --dim and --batch-sizes are checked one by
  // one, their product here (a bad_alloc was the answer before).
  int64_t bytes = static_cast<int64_t>(dtype_size(io.dtype));
  for (auto d : shape) {
    if (d != 0 && bytes > kMaxRandomInputBytes / d)
      throw Error(ErrorCode::kInvalidArgument, "random input '" + io.name + "' of shape " + shape_to_string(shape) +
                                                   " would take more than " + std::to_string(kMaxRandomInputBytes) +
                                                   " bytes; choose smaller --dim / --batch-sizes or give it as a .npy");
    bytes *= d;
  }
  Tensor t = Tensor::empty_host(io.dtype, shape);
  std::uniform_real_distribution<float> real(-1.f, 1.f);
  std::uniform_int_distribution<int> integer(0, 9);
  auto n = static_cast<std::size_t>(t.view().numel());
  auto fill = [&](auto* p, auto gen) {
    for (std::size_t i = 0; i < n; ++i) p[i] = gen();
  };
  switch (io.dtype) {
    case DType::kFloat32: fill(static_cast<float*>(t.data()), [&] { return real(rng); }); break;
    case DType::kFloat64: fill(static_cast<double*>(t.data()), [&] { return double(real(rng)); }); break;
    case DType::kInt64: fill(static_cast<int64_t*>(t.data()), [&] { return int64_t(integer(rng)); }); break;
    case DType::kInt32: fill(static_cast<int32_t*>(t.data()), [&] { return int32_t(integer(rng)); }); break;
    case DType::kInt16: fill(static_cast<int16_t*>(t.data()), [&] { return int16_t(integer(rng)); }); break;
    case DType::kInt8: fill(static_cast<int8_t*>(t.data()), [&] { return int8_t(integer(rng)); }); break;
    case DType::kUInt8: fill(static_cast<uint8_t*>(t.data()), [&] { return uint8_t(integer(rng)); }); break;
    case DType::kBool: fill(static_cast<uint8_t*>(t.data()), [&] { return uint8_t(integer(rng) & 1); }); break;
    case DType::kFloat16:
    case DType::kBFloat16: {
      // Exact small values: k/8 for k in [-8, 8] have short mantissas in both formats.
      auto* p = static_cast<uint16_t*>(t.data());
      for (std::size_t i = 0; i < n; ++i) {
        float f = static_cast<float>(integer(rng) - 4) / 8.f;
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        if (io.dtype == DType::kBFloat16) {
          p[i] = static_cast<uint16_t>(bits >> 16);
        } else {
          uint32_t sign = (bits >> 16) & 0x8000u;
          int32_t exp = static_cast<int32_t>((bits >> 23) & 0xff) - 127 + 15;
          uint32_t mant = (bits >> 13) & 0x3ffu;
          p[i] = f == 0.f ? 0 : static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | mant);
        }
      }
      break;
    }
  }
  return t;
}

ExecutionProvider resolve_provider(const std::string& text) {
  if (text != "auto") {
    try {
      return parse_execution_provider(text);
    } catch (const Error& e) {
      // the command line takes "auto" too (its default), which the engine's names lack
      if (e.code() != ErrorCode::kInvalidArgument) throw;
      throw Error(ErrorCode::kInvalidArgument, std::string(e.what()) + ", auto");
    }
  }
  // Best available here: CUDA where its provider loads, else the CPU.
  bool cuda = OrtRuntime::load()->provider_status(ExecutionProvider::kCUDA).available;
  auto provider = cuda ? ExecutionProvider::kCUDA : ExecutionProvider::kCPU;
  std::cout << "provider: " << execution_provider_name(provider) << " (auto)\n";
  return provider;
}

std::map<std::string, Tensor> load_input_files(const std::vector<std::string>& specs,
                                               const std::vector<IoInfo>& inputs) {
  std::vector<std::string> names;
  for (const auto& io : inputs) names.push_back(io.name);
  std::map<std::string, Tensor> given;
  for (const auto& spec : specs) {
    auto [name, file] = split_named_assignment(spec, "--input", names, "model's inputs");
    if (given.count(name))
      throw Error(ErrorCode::kInvalidArgument, "--input gives model input '" + name + "' more than once");
    given[name] = load_npy(file);
  }
  return given;
}

std::map<std::string, int64_t> parse_dims(const std::vector<std::string>& dims, const std::vector<IoInfo>& inputs) {
  std::set<std::string> symbols;
  for (const auto& io : inputs)
    for (std::size_t i = 0; i < io.shape.size() && i < io.symbolic_dims.size(); ++i)
      if (io.shape[i] < 0 && !io.symbolic_dims[i].empty()) symbols.insert(io.symbolic_dims[i]);
  std::map<std::string, int64_t> out;
  for (const auto& d : dims) {
    auto [k, v] = split_assignment(d, "--dim");
    if (!symbols.count(k)) {
      std::string names;
      for (const auto& s : symbols) names += (names.empty() ? "" : ", ") + s;
      throw Error(ErrorCode::kInvalidArgument, "--dim " + d + ": the model's inputs have no symbolic dimension '" + k +
                                                   "'; they have: " + (names.empty() ? "none" : names));
    }
    if (out.count(k))  // the last value won, without a word (a repeated --input is refused too)
      throw Error(ErrorCode::kInvalidArgument, "--dim " + k + " is given twice; give each symbol once");
    out[k] = parse_integer(v, 1, kMaxExtent, "--dim " + k);
  }
  return out;
}

std::map<std::string, int64_t> dims_with_given(std::map<std::string, int64_t> dims,
                                               const std::map<std::string, Tensor>& given,
                                               const std::vector<IoInfo>& inputs, const std::string& given_as,
                                               const std::string& given_after) {
  std::map<std::string, std::string> fixed_by;  // symbol -> the input that fixed it
  for (const auto& io : inputs) {
    auto it = given.find(io.name);
    if (it == given.end() || it->second.shape().size() != io.shape.size()) continue;  // a rank error comes later
    for (std::size_t i = 0; i < io.shape.size() && i < io.symbolic_dims.size(); ++i) {
      const std::string& symbol = io.symbolic_dims[i];
      if (io.shape[i] >= 0 || symbol.empty()) continue;
      const int64_t extent = it->second.shape()[i];
      auto known = dims.find(symbol);
      if (known != dims.end() && known->second != extent) {
        auto by = fixed_by.find(symbol);
        throw Error(ErrorCode::kInvalidArgument,
                    given_as + io.name + given_after + " has " + std::to_string(extent) +
                        " on the model's symbolic dimension '" + symbol + "', but " +
                        (by != fixed_by.end() ? given_as + by->second + given_after : std::string("--dim ") + symbol) +
                        " gives " +
                        std::to_string(known->second) + ": inputs sharing a dimension must agree on it");
      }
      if (known == dims.end()) fixed_by[symbol] = io.name;
      dims[symbol] = extent;
    }
  }
  return dims;
}

std::vector<std::map<std::string, Tensor>> load_sample_dir(const std::string& dir,
                                                            const std::vector<IoInfo>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(ErrorCode::kIo, "--samples '" + dir + "' is not a directory");
  std::string expected;
  for (const auto& io : inputs) expected += (expected.empty() ? "" : ", ") + io.name + ".npy";
  const fs::path root = fs::canonical(dir, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot resolve --samples '" + dir + "': " + ec.message());
  // An input name is a file name inside DIR: one that is absolute, has a '/' or is ".."
  // would read elsewhere, as would a symbolic link that leads out of DIR.
  auto contained = [&](const fs::path& file, const std::string& input) {
    const fs::path relative = fs::path(input + ".npy");
    std::error_code resolve_ec;
    const fs::path resolved = fs::weakly_canonical(file, resolve_ec);
    auto [r, unused] = std::mismatch(root.begin(), root.end(), resolved.begin(), resolved.end());
    if (input.find('/') != std::string::npos || relative.is_absolute() || resolve_ec || r != root.end())
      throw Error(ErrorCode::kInvalidArgument,
                  "--samples: the file of model input '" + input + "', '" + file.string() + "', lies outside '" +
                      root.string() + "' (an input name that is a path, or a symbolic link leading out); every sample "
                      "file must be inside the samples directory");
  };
  auto read_sample = [&](const fs::path& d) {
    std::map<std::string, Tensor> sample;
    for (const auto& io : inputs) {
      auto file = d / (io.name + ".npy");
      contained(file, io.name);
      if (!fs::is_regular_file(file))
        throw Error(ErrorCode::kInvalidArgument,
                    "sample directory '" + d.string() + "' lacks " + io.name + ".npy; each sample needs: " + expected);
      Tensor tensor = load_npy(file.string());
      // Checked here, where the file is known: the session's own refusal ("input 'x':
      // expected dtype float32, got float64") named no file among many samples.
      if (tensor.dtype() != io.dtype)
        throw Error(ErrorCode::kDTypeMismatch, "sample file '" + file.string() + "' holds " +
                                                   std::string(dtype_name(tensor.dtype())) + "; model input '" +
                                                   io.name + "' takes " + std::string(dtype_name(io.dtype)));
      const Shape& shape = tensor.shape();
      bool fits = !io.rank_known || shape.size() == io.shape.size();
      for (std::size_t a = 0; fits && io.rank_known && a < shape.size(); ++a)
        fits = io.shape[a] < 0 || io.shape[a] == shape[a];
      if (!fits)
        throw Error(ErrorCode::kShapeMismatch, "sample file '" + file.string() + "' has shape " +
                                                   shape_to_string(shape) + "; model input '" + io.name + "' takes " +
                                                   shape_to_string(io.shape) + " (-1: any extent)");
      sample[io.name] = std::move(tensor);
    }
    for (const auto& entry : fs::directory_iterator(d))
      if (entry.is_regular_file() && entry.path().extension() == ".npy" &&
          std::none_of(inputs.begin(), inputs.end(),
                       [&](const IoInfo& io) { return io.name == entry.path().stem().string(); }))
        throw Error(ErrorCode::kInvalidArgument, "sample file '" + entry.path().string() +
                                                     "' names no model input; the model takes: " + expected);
    // Inputs sharing a symbolic dimension agree on it, as `aitune run` requires: a sample
    // that ORT broadcast (a[2, K] + b[1, K]) made a checkpoint that no input could run.
    try {
      dims_with_given({}, sample, inputs, "", ".npy");
    } catch (const Error& e) {
      throw Error(ErrorCode::kInvalidArgument, "sample directory '" + d.string() + "': " + e.what());
    }
    return sample;
  };
  std::vector<fs::path> subdirs;
  for (const auto& entry : fs::directory_iterator(root))
    if (entry.is_directory()) subdirs.push_back(entry.path());  // a linked one is checked file by file
  std::sort(subdirs.begin(), subdirs.end());
  std::vector<std::map<std::string, Tensor>> samples;
  if (!subdirs.empty())
    for (const auto& entry : fs::directory_iterator(root))
      if (entry.is_regular_file() && entry.path().extension() == ".npy")
        // one sample in DIR itself or one per subdirectory: with both, DIR's was left out silently
        throw Error(ErrorCode::kInvalidArgument,
                    "--samples '" + dir + "' holds both sample files ('" + entry.path().filename().string() +
                        "') and sample subdirectories; put every sample in a subdirectory of its own");
  if (subdirs.empty()) {
    samples.push_back(read_sample(root));
  } else {
    for (const auto& d : subdirs) samples.push_back(read_sample(d));
  }
  return samples;
}

}  // namespace aitune::cli
