// `aitune doctor`: where ONNX Runtime was found (which wheel), and per provider: available
// or why not, with the CUDA / cuDNN libraries the GPU providers resolved.
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
            const OrtWheel& wheel = rt->wheel();
            if (!wheel.distribution.empty()) {
              std::cout << "  from the Python package " << wheel.distribution << " " << wheel.version << " ("
                        << wheel.capi_dir << ")\n";
            } else if (!wheel.capi_dir.empty()) {
              std::cout << "  from a wheel's layout without its metadata (" << wheel.capi_dir << ")\n";
            } else {
              std::cout << "  not from a Python package\n";
            }
            if (!wheel.warning.empty()) std::cout << "  warning: " << wheel.warning << "\n";
            std::cout << "  searched: ";
            auto paths = OrtRuntime::search_paths(*options);
            for (std::size_t i = 0; i < paths.size(); ++i) std::cout << (i ? ", " : "") << paths[i];
            std::cout << "\n  provider libraries looked for in: " << rt->providers_dir() << "\n";
            std::cout << "  CUDA libraries looked for in: ";
            const auto& dirs = rt->cuda_library_dirs();
            for (std::size_t i = 0; i < dirs.size(); ++i) std::cout << (i ? ", " : "") << dirs[i];
            std::cout << (dirs.empty() ? "(no folder; the system loader's path)" : ", then the system loader's path")
                      << "\n";
            std::cout << "execution providers:\n";
            for (auto p : registered_execution_providers()) {
              auto s = rt->provider_status(p);
              std::string name(execution_provider_name(p));
              name.resize(10, ' ');
              std::cout << "  " << name << (s.available ? "available" : "unavailable");
              if (!s.available) std::cout << ": " << s.reason;
              std::cout << "\n";
              for (const auto& line : provider_doctor_details(s)) std::cout << "            " << line << "\n";
            }
            return 0;
          }};
}

}  // namespace aitune::cli
