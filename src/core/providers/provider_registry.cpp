// The provider registry: the built-in providers registered in one place, lookups by name.
#include "providers/provider_registry.hpp"

#include <algorithm>
#include <cctype>
#include <deque>
#include <mutex>

#include "aitune/error.hpp"
#include "ort/ort_runtime_impl.hpp"

namespace aitune {

namespace providers {
// The built-in providers, one file each (providers/<name>_provider.cpp). Adding one: its
// file, a line here and one in registry() below, and its source in src/core/CMakeLists.txt.
ProviderDescription cpu();
ProviderDescription cuda();
ProviderDescription tensorrt();
}  // namespace providers

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

struct Registry {
  std::mutex mutex;
  std::deque<ProviderDescription> providers;  // a deque: registering never moves a description

  void add_locked(ProviderDescription d) {
    if (d.name.empty() || d.name != lower(d.name))
      throw Error(ErrorCode::kInvalidArgument, "execution provider name '" + d.name + "' must be non-empty lower case");
    for (const auto& p : providers)
      if (p.name == d.name || lower(p.ort_name) == lower(d.ort_name))
        throw Error(ErrorCode::kInvalidArgument, "execution provider '" + d.name + "' (" + d.ort_name +
                                                     ") is registered already");
    providers.push_back(std::move(d));
  }
};

Registry& registry() {
  // The built-in providers: the one place a provider is registered.
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: handles hold views of its names
    reg->add_locked(providers::cpu());
    reg->add_locked(providers::cuda());
    reg->add_locked(providers::tensorrt());
    return reg;
  }();
  return *r;
}

const ProviderDescription* find(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  for (const auto& p : r.providers)
    if (p.name == name) return &p;
  return nullptr;
}

std::string registered_names() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  std::string out;
  for (const auto& p : r.providers) out += (out.empty() ? "" : ", ") + p.name;
  return out;
}

}  // namespace

void register_execution_provider(ProviderDescription description) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  r.add_locked(std::move(description));
}

const ProviderDescription& provider_description(ExecutionProvider provider) {
  if (const auto* d = find(provider.name())) return *d;
  throw Error(ErrorCode::kInvalidArgument, "unknown execution provider '" + std::string(provider.name()) +
                                               "'; registered: " + registered_names());
}

std::string_view execution_provider_name(ExecutionProvider provider) noexcept { return provider.name(); }

std::string_view execution_provider_ort_name(ExecutionProvider provider) noexcept {
  const auto* d = find(provider.name());
  return d ? std::string_view(d->ort_name) : std::string_view("CPUExecutionProvider");
}

ExecutionProvider parse_execution_provider(std::string_view text) {
  const std::string wanted = lower(text);
  {
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    for (const auto& p : r.providers)
      if (wanted == p.name || wanted == lower(p.ort_name)) return ExecutionProvider(p.name);
  }
  throw Error(ErrorCode::kInvalidArgument,
              "unknown execution provider '" + std::string(text) + "'; valid values: " + registered_names());
}

std::vector<ExecutionProvider> registered_execution_providers() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<ExecutionProvider> out;
  for (const auto& p : r.providers) out.emplace_back(p.name);
  return out;
}

// Defined here rather than in ort_runtime.cpp: the runtime asks the registry, so the
// ONNX Runtime loading code does not depend on the providers (which depend on it).
ProviderStatus OrtRuntime::Impl::probe(ExecutionProvider provider) {
  const auto& description = provider_description(provider);
  ProviderStatus s;
  if (description.probe) s = description.probe(*this);
  else s.reason = description.name + " execution provider unavailable: it has no availability check";
  s.provider = provider;
  return s;
}

std::vector<std::string> provider_doctor_details(const ProviderStatus& status) {
  const auto& d = provider_description(status.provider);
  return d.doctor_details ? d.doctor_details(status) : std::vector<std::string>{};
}

const ProviderCapabilities& provider_capabilities(ExecutionProvider provider) {
  return provider_description(provider).capabilities;
}

namespace detail {

bool option_on(const std::map<std::string, std::string>& options, const std::string& key) {
  auto it = options.find(key);
  return it != options.end() && it->second != "0" && it->second != "false";
}

std::optional<std::string> triton_process_local_option(const std::string& key, const std::string& value) {
  if (key == "user_compute_stream" || key == "has_user_compute_stream")
    return "provider option " + key + "=" + value +
           ": a stream of the tuning process; Triton gives each instance its own CUDA stream";
  if (key == "device_id")
    return "provider option device_id=" + value +
           ": Triton places each instance on the GPUs of its instance_group (all visible GPUs by default)";
  return std::nullopt;
}

}  // namespace detail
}  // namespace aitune
