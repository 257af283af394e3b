// DeferredReleases: a session is destroyed only once its CUDA stream has drained.
#include "session/deferred_release.hpp"

#include "cuda/cuda_stream.hpp"

namespace aitune::detail {

void DeferredReleases::release(std::uintptr_t stream, std::function<void()> destroy) {
  retry();
  if (stream == 0 || drain_(stream)) {
    destroy();
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  parked_.push_back({stream, std::move(destroy)});
}

std::size_t DeferredReleases::retry() {
  std::vector<Parked> ready;
  std::size_t left = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (parked_.empty()) return 0;
    std::vector<Parked> keep;
    for (auto& p : parked_) (drain_(p.stream) ? ready : keep).push_back(std::move(p));
    parked_ = std::move(keep);
    left = parked_.size();
  }
  // Outside the lock: a destroy may release another session (tensors keep sessions alive).
  for (auto& p : ready) p.destroy();
  return left;
}

std::size_t DeferredReleases::parked() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return parked_.size();
}

DeferredReleases& session_releases() {
  static auto* releases = new DeferredReleases([](std::uintptr_t stream) { return drain_stream(stream); });
  return *releases;
}

}  // namespace aitune::detail
