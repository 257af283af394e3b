// Releases of CUDA sessions that must wait until their stream has run dry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace aitune::detail {

/// Deleting an ONNX Runtime CUDA session frees its pinned-memory arena. The CUDA provider
/// returns pinned buffers to that arena from host functions it queues on the session's
/// stream (runs are not synchronised at their end), and each of those holds the arena
/// too. A session deleted while one is still queued leaves the host function as the
/// arena's last owner: the arena is then destroyed on CUDA's callback thread, where CUDA
/// calls are not permitted, and cudaFreeHost fails there ("CUDA failure 800: operation
/// not permitted ... cudaFreeHost", GPU=-1), which aborts the process (seen on the H200
/// after a Swin-T tune). So a session is destroyed only once its stream has drained; when
/// the stream cannot be waited for now (it, or a stream of another library such as
/// torch's CUDA graphs, is capturing), the release is parked and retried later.
/// Draining before the delete did not stop the abort on the H200 (session 14): the
/// deletion itself can queue such a host function (buffers a run left to release). So the
/// deleter also holds a reference to the session's pinned allocator across the delete and
/// drops it, with the stream, in a second release once the stream has drained again: the
/// arena is then destroyed on the releasing thread, never on CUDA's callback thread.
class DeferredReleases {
 public:
  /// `drain(stream)`: true once every piece of work queued on `stream` so far, host
  /// functions included, has finished; false when that cannot be waited for now.
  using Drain = std::function<bool(std::uintptr_t stream)>;

  explicit DeferredReleases(Drain drain) : drain_(std::move(drain)) {}

  /// Retries the parked releases, then runs `destroy` now if `stream` drains (stream 0:
  /// no stream, always), or parks it. Never throws out of a failed drain.
  void release(std::uintptr_t stream, std::function<void()> destroy);

  /// Runs the parked releases whose streams drain now; returns how many stay parked.
  std::size_t retry();

  /// How many releases are parked now.
  std::size_t parked() const;

 private:
  struct Parked {
    std::uintptr_t stream;
    std::function<void()> destroy;
  };
  Drain drain_;
  mutable std::mutex mutex_;
  std::vector<Parked> parked_;
};

/// The process's releases of ONNX Runtime sessions, draining with drain_stream. Never
/// destroyed: a session still parked when the process exits is left to the operating
/// system (destroying it then would run into the same hazard).
DeferredReleases& session_releases();

}  // namespace aitune::detail
