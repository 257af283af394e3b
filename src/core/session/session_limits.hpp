// Private: the ranges a session's numeric settings must lie in, shared by session creation and the checkpoint manifest.
#pragma once

namespace aitune::detail {

/// Range of a session's intra-/inter-op thread counts (0 = ORT's default). 100,000
/// intra-op threads made a load hang for minutes at 1.2 GB (issue 17).
inline constexpr int kMaxSessionThreads = 1024;
/// Range of a CUDA device index.
inline constexpr int kMaxDeviceId = 1023;

}  // namespace aitune::detail
