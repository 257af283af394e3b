// `aitune doctor`: where ONNX Runtime was found and, per provider, available or why not.
#include <iostream>

#include "aitune/error.hpp"
#include "aitune/ort_runtime.hpp"
#include "aitune/version.hpp"
#include "commands.hpp"

namespace aitune::cli {

Command add_doctor(CLI::App& app) {
  auto* sub = app.add_subcommand("doctor", "Show the ONNX Runtime in use and which execution providers work here");
  auto options = std::make_shared<OrtRuntimeOptions>();
  sub->add_option("--ort-library", options->library_path, "libonnxruntime.so to load (default: search)");
  sub->add_option("--providers-dir", options->providers_dir, "directory holding the GPU provider libraries");
  return {sub, [options] {
            std::cout << "aitune " << version() << " (ONNX Runtime API " << ort_api_version() << ")\n";
            std::shared_ptr<OrtRuntime> rt;
            try {
              rt = OrtRuntime::load(*options);
            } catch (const Error& e) {
              std::cout << "ONNX Runtime: not loaded\n" << e.what() << "\n";
              return 3;
            }
            std::cout << "ONNX Runtime " << rt->version() << ": " << rt->library_path() << "\n";
            std::cout << "  searched: ";
            auto paths = OrtRuntime::search_paths(*options);
            for (std::size_t i = 0; i < paths.size(); ++i) std::cout << (i ? ", " : "") << paths[i];
            std::cout << "\n  provider libraries looked for in: " << rt->providers_dir() << "\n";
            std::cout << "execution providers:\n";
            for (auto p : {ExecutionProvider::kCPU, ExecutionProvider::kCUDA, ExecutionProvider::kTensorRT}) {
              auto s = rt->provider_status(p);
              std::string name(execution_provider_name(p));
              name.resize(10, ' ');
              std::cout << "  " << name << (s.available ? "available" : "unavailable");
              if (!s.available) std::cout << ": " << s.reason;
              std::cout << "\n";
            }
            return 0;
          }};
}

}  // namespace aitune::cli
