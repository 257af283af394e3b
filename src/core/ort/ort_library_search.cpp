// Finds ONNX Runtime's wheel layout on disk and preloads the CUDA libraries its GPU
// providers link, the way onnxruntime's Python package does (preload_dlls).
#include "ort/ort_library_search.hpp"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <filesystem>
#include <regex>

namespace aitune::detail {
namespace fs = std::filesystem;

namespace {

constexpr const char* kOrtLibraryPrefix = "libonnxruntime.so.1";

// "libonnxruntime.so.1.31.1" -> {1, 31, 1}; non-numeric parts count as 0.
std::vector<long> version_of(const std::string& file_name) {
  std::vector<long> parts;
  const std::string suffix = file_name.substr(std::string("libonnxruntime.so.").size());
  std::size_t start = 0;
  while (start <= suffix.size()) {
    std::size_t dot = suffix.find('.', start);
    if (dot == std::string::npos) dot = suffix.size();
    const std::string part = suffix.substr(start, dot - start);
    parts.push_back(part.empty() || part.find_first_not_of("0123456789") != std::string::npos ? 0 : std::stol(part));
    start = dot + 1;
  }
  return parts;
}

// site-packages of a wheel's `onnxruntime/capi` folder, or "" when `capi_dir` is not one.
fs::path site_packages_of(const fs::path& capi_dir) {
  if (capi_dir.filename() != "capi" || capi_dir.parent_path().filename() != "onnxruntime") return {};
  return capi_dir.parent_path().parent_path();
}

}  // namespace

std::string ort_library_in(const std::string& capi_dir) {
  std::error_code ec;
  std::string best;
  std::vector<long> best_version;
  for (const auto& entry : fs::directory_iterator(capi_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kOrtLibraryPrefix, 0) != 0) continue;
    if (name.size() > std::char_traits<char>::length(kOrtLibraryPrefix) &&
        name[std::char_traits<char>::length(kOrtLibraryPrefix)] != '.')
      continue;  // e.g. libonnxruntime.so.10: not major version 1
    auto v = version_of(name);
    if (best.empty() || v > best_version) {
      best = entry.path().string();
      best_version = std::move(v);
    }
  }
  return best;
}

OrtWheel wheel_of_library(const std::string& library) {
  OrtWheel wheel;
  const fs::path capi = fs::path(library).parent_path();
  const fs::path site = site_packages_of(capi);
  if (site.empty()) return wheel;
  wheel.capi_dir = capi.string();
  // Wheel metadata folders: onnxruntime-1.31.1.dist-info, onnxruntime_gpu-1.31.1.dist-info.
  static const std::regex dist_info(R"(^(onnxruntime|onnxruntime[_-]gpu)-([^-]+)\.dist-info$)",
                                    std::regex::icase);
  std::vector<std::pair<std::string, std::string>> found;  // (distribution, version)
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(site, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, dist_info)) continue;
    std::string dist = m[1].str();
    std::replace(dist.begin(), dist.end(), '_', '-');
    std::transform(dist.begin(), dist.end(), dist.begin(), [](unsigned char c) { return std::tolower(c); });
    found.emplace_back(dist, m[2].str());
  }
  std::sort(found.begin(), found.end());
  if (found.size() == 1) {
    wheel.distribution = found[0].first;
    wheel.version = found[0].second;
  } else if (found.size() > 1) {
    // Both share the `onnxruntime` package: its files are those installed last. The CUDA
    // provider library exists only if the GPU wheel was installed at some point.
    const bool gpu = fs::exists(capi / "libonnxruntime_providers_cuda.so", ec);
    const auto& pick = gpu ? found.back() : found.front();  // sorted: onnxruntime < onnxruntime-gpu
    wheel.distribution = pick.first;
    wheel.version = pick.second;
    wheel.warning = "both " + found[0].first + " " + found[0].second + " and " + found[1].first + " " +
                    found[1].second + " are installed in " + site.string() +
                    "; they share the onnxruntime package, so its files are those installed last: "
                    "uninstall both and install one";
  }
  return wheel;
}

std::vector<std::string> nvidia_library_dirs_beside(const std::string& capi_dir) {
  std::vector<std::string> dirs;
  const fs::path site = site_packages_of(fs::path(capi_dir));
  if (site.empty()) return dirs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(site / "nvidia", ec)) {
    if (fs::is_directory(entry.path() / "lib", ec)) dirs.push_back((entry.path() / "lib").string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

const std::vector<std::string>& cuda_library_sonames() {
  // The order of onnxruntime's preload_dlls for CUDA 13 (nvidia/cu13/lib, nvidia/cudnn/lib).
  static const std::vector<std::string> names = {"libcublasLt.so.13", "libcublas.so.13", "libnvrtc.so.13",
                                                 "libcurand.so.10",   "libcufft.so.12",  "libcudart.so.13",
                                                 "libcudnn.so.9"};
  return names;
}

namespace {
// The file a library already in the process was loaded from, "" when it is not loaded.
std::string loaded_path(const std::string& soname) {
  void* h = dlopen(soname.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return {};
  std::string path;
  link_map* map = nullptr;
  if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) path = map->l_name;
  dlclose(h);
  std::error_code ec;
  auto canonical = fs::weakly_canonical(path, ec);
  return ec ? path : canonical.string();
}
}  // namespace

std::vector<std::string> preload_cuda_libraries(const std::vector<std::string>& dirs) {
  std::vector<std::string> failures;
  for (const auto& name : cuda_library_sonames()) {
    if (!loaded_path(name).empty()) continue;  // torch (or an earlier preload) has it
    for (const auto& dir : dirs) {
      const fs::path path = fs::path(dir) / name;
      std::error_code ec;
      if (!fs::exists(path, ec)) continue;
      // Never closed: the provider's references to it resolve to this copy.
      if (!dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
        const char* e = dlerror();
        failures.push_back(path.string() + ": " + (e ? e : "dlopen failed"));
      }
      break;
    }
  }
  return failures;
}

std::vector<std::string> loaded_cuda_libraries() {
  std::vector<std::string> lines;
  std::vector<std::string> names = cuda_library_sonames();
  names.push_back("libcuda.so.1");
  for (const auto& name : names) {
    if (auto path = loaded_path(name); !path.empty()) lines.push_back(name + ": " + path);
  }
  return lines;
}

}  // namespace aitune::detail
