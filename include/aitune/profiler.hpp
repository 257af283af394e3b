// Profiler: latency of repeated calls, measured in windows until stable, with a clock
// and an optional device timer that tests can replace.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aitune/latency_stats.hpp"

namespace aitune {

/// How `profile_calls` measures. The defaults follow Triton Model Navigator's stable
/// window (windows of calls until the last window means agree) with a time cap.
struct ProfileConfig {
  int warmup_calls = 10;      ///< run first, excluded from every statistic
  int window_calls = 25;      ///< calls per window
  int stable_windows = 3;     ///< the last this many window means must agree...
  double stability = 0.10;    ///< ...within this: (max - min) / min of those means
  int max_windows = 40;       ///< stop (unstable) after this many windows
  double time_cap_s = 5.0;    ///< stop (unstable) once this much time has passed, warm-up included
  /// The tuner's final round (GraphTuner::select): the passed candidates whose host p50 is
  /// within this fraction of the best one's are measured again, interleaved...
  double final_round_margin = 0.10;
  /// ...in this many rounds of one window each (after one warm-up window each); 0: no final round...
  int final_round_windows = 5;
  /// ...the fastest this many of them by their first p50 (one alone is measured again too,
  /// beside the reference); 0: no final round.
  int final_round_max = 4;

  /// Throws Error(kInvalidArgument) naming the field that is out of range.
  void validate() const;
  bool operator==(const ProfileConfig&) const = default;
};

/// A monotonic clock in microseconds. Injected so tests can script time.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual double now_us() = 0;
};

/// std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  double now_us() override;
};

/// Measures device time of one call: `start` before it, `stop` after it. `stop` blocks
/// until the device has finished the work queued so far, so host time measured around
/// start/stop covers the whole call. `elapsed_us` is the device time between the last
/// start and stop.
class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  virtual void start() = 0;
  virtual void stop() = 0;
  virtual double elapsed_us() = 0;
};

/// What `profile_calls` measured. Latencies in microseconds over the calls of the last
/// `stable_windows` windows (all measured calls when fewer windows completed).
struct Profile {
  int64_t batch_size = 1;
  LatencyStats host_us;                  ///< wall time per call
  std::optional<LatencyStats> device_us; ///< device time per call (with a DeviceTimer)
  double throughput = 0;                 ///< samples per second: batch_size / host p50
  int warmup_calls = 0;
  int windows = 0;                       ///< complete windows measured
  int measured_calls = 0;                ///< calls measured, statistics' or not
  bool stable = false;
  std::string stop_reason;               ///< "stable", "time cap", "max windows", "final round"
  double total_s = 0;                    ///< warm-up included

  std::string to_json(int indent = 2) const;
};

/// Calls `call` `warmup_calls` times, then in windows of `window_calls` until stable, the
/// time cap or `max_windows`. At least one call is always measured. Exceptions from
/// `call` propagate. Not thread-safe with respect to `clock` and `timer`.
Profile profile_calls(const std::function<void()>& call, int64_t batch_size, const ProfileConfig& config,
                      Clock& clock, DeviceTimer* timer = nullptr);

/// Same with a SteadyClock.
Profile profile_calls(const std::function<void()>& call, int64_t batch_size, const ProfileConfig& config,
                      DeviceTimer* timer = nullptr);

/// One call timed as `profile_calls` times each: its host microseconds by `clock`, and
/// with a `timer` its device microseconds appended to `device` (when `device` is not null).
/// The tuner's final round times its calls with it too.
double time_call(const std::function<void()>& call, Clock& clock, DeviceTimer* timer, std::vector<double>* device);

/// `profile`'s latencies from measured calls: host_us, device_us (when `device` is given)
/// and the throughput of `profile.batch_size` samples per host p50.
void set_latencies(Profile& profile, const std::vector<double>& host, const std::vector<double>* device);

}  // namespace aitune
