// `aitune inspect MODEL.onnx`: inputs/outputs, dtypes, symbolic dims, opset, external data.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <set>

#include "aitune/error.hpp"
#include "aitune/onnx_runtime_backend.hpp"
#include "commands.hpp"

namespace aitune::cli {
namespace fs = std::filesystem;
namespace {

// ORT does not expose which external data files a model uses. In the ONNX protobuf each
// reference is a StringStringEntryProto {key: "location", value: <file>}, whose bytes
// are 0x0a 0x08 "location" 0x12 <varint length> <file>; a scan for that record finds the
// files without a protobuf dependency in the CLI.
std::set<std::string> external_data_files(const std::string& model_path) {
  std::ifstream in(model_path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  static const std::string marker = std::string("\x0a\x08location\x12", 11);
  std::set<std::string> files;
  for (auto pos = bytes.find(marker); pos != std::string::npos; pos = bytes.find(marker, pos + 1)) {
    std::size_t i = pos + marker.size();
    uint64_t len = 0;
    int shift = 0;
    while (i < bytes.size() && shift < 35) {
      auto b = static_cast<unsigned char>(bytes[i++]);
      len |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
      shift += 7;
    }
    if (len > 0 && len < 4096 && i + len <= bytes.size()) files.insert(bytes.substr(i, len));
  }
  return files;
}

std::string dims_to_string(const IoInfo& io) {
  std::string out = "[";
  for (std::size_t i = 0; i < io.shape.size(); ++i) {
    if (i) out += ", ";
    out += io.shape[i] >= 0 ? std::to_string(io.shape[i]) : (io.symbolic_dims[i].empty() ? "?" : io.symbolic_dims[i]);
  }
  return out + "]";
}

}  // namespace

Command add_inspect(CLI::App& app) {
  auto* sub = app.add_subcommand("inspect", "Show a model's inputs, outputs, opset and external data");
  auto model = std::make_shared<std::string>();
  sub->add_option("model", *model, "path to an .onnx file")->required();
  return {sub, [model] {
            OnnxRuntimeBackendConfig config;
            config.provider = ExecutionProvider::kCPU;  // introspection needs no device
            config.graph_optimization_level = GraphOptimizationLevel::kDisableAll;
            auto backend = OnnxRuntimeBackend::create(*model, config);
            std::cout << "model: " << *model << " (" << human_bytes(fs::file_size(*model)) << ")\n";
            std::cout << "opset: " << backend->opset() << "\n";
            for (auto [title, list] : {std::pair{"inputs", &backend->inputs()}, std::pair{"outputs", &backend->outputs()}}) {
              std::cout << title << ":\n";
              for (const auto& io : *list)
                std::cout << "  " << io.name << ": " << dtype_name(io.dtype) << dims_to_string(io) << "\n";
            }
            auto files = external_data_files(*model);
            if (files.empty()) {
              std::cout << "external data: none\n";
            } else {
              std::uintmax_t total = 0;
              std::cout << "external data:\n";
              for (const auto& f : files) {
                auto p = fs::path(*model).parent_path() / f;
                std::error_code ec;
                auto size = fs::file_size(p, ec);
                std::cout << "  " << f << ": " << (ec ? std::string("missing") : human_bytes(size)) << "\n";
                if (!ec) total += size;
              }
              std::cout << "  total: " << human_bytes(total) << "\n";
            }
            return 0;
          }};
}

}  // namespace aitune::cli
