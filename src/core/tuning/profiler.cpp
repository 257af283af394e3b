// Windowed latency measurement.
#include "aitune/profiler.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <vector>

#include <nlohmann/json.hpp>

#include "aitune/error.hpp"

namespace aitune {
namespace {

nlohmann::json stats_json(const LatencyStats& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"std", s.stddev}, {"min", s.min}, {"max", s.max},
          {"p50", s.p50},     {"p90", s.p90},   {"p95", s.p95},    {"p99", s.p99}};
}

double mean_of(std::vector<double>::const_iterator begin, std::vector<double>::const_iterator end) {
  return std::accumulate(begin, end, 0.0) / static_cast<double>(end - begin);
}

}  // namespace

void ProfileConfig::validate() const {
  auto check = [](bool ok, const char* what) {
    if (!ok) throw Error(ErrorCode::kInvalidArgument, std::string("ProfileConfig: ") + what);
  };
  check(warmup_calls >= 0, "warmup_calls must be >= 0");
  check(window_calls >= 1, "window_calls must be >= 1");
  check(stable_windows >= 1, "stable_windows must be >= 1");
  check(stability > 0, "stability must be > 0");
  check(max_windows >= stable_windows, "max_windows must be >= stable_windows");
  check(time_cap_s > 0, "time_cap_s must be > 0");
  check(final_round_margin >= 0, "final_round_margin must be >= 0");
  check(final_round_windows >= 0, "final_round_windows must be >= 0");
  check(final_round_max >= 0, "final_round_max must be >= 0");
}

double SteadyClock::now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string Profile::to_json(int indent) const {
  nlohmann::json j = {{"batch_size", batch_size},     {"host_us", stats_json(host_us)},
                      {"throughput", throughput},     {"warmup_calls", warmup_calls},
                      {"windows", windows},           {"measured_calls", measured_calls},
                      {"stable", stable},             {"stop_reason", stop_reason},
                      {"total_s", total_s}};
  j["device_us"] = device_us ? stats_json(*device_us) : nlohmann::json(nullptr);
  return j.dump(indent);
}

double time_call(const std::function<void()>& call, Clock& clock, DeviceTimer* timer, std::vector<double>* device) {
  const double start = clock.now_us();
  if (timer) timer->start();
  call();
  if (timer) timer->stop();
  const double host = clock.now_us() - start;
  if (timer && device) device->push_back(timer->elapsed_us());
  return host;
}

void set_latencies(Profile& profile, const std::vector<double>& host, const std::vector<double>* device) {
  profile.host_us = summarize_latencies(host);
  if (device) profile.device_us = summarize_latencies(*device);
  profile.throughput =
      profile.host_us.p50 > 0 ? static_cast<double>(profile.batch_size) * 1e6 / profile.host_us.p50 : 0;
}

Profile profile_calls(const std::function<void()>& call, int64_t batch_size, const ProfileConfig& config,
                      Clock& clock, DeviceTimer* timer) {
  config.validate();
  if (batch_size < 1) throw Error(ErrorCode::kInvalidArgument, "profile_calls: batch_size must be >= 1");
  Profile profile;
  profile.batch_size = batch_size;
  const double begin = clock.now_us();
  const double cap_us = config.time_cap_s * 1e6;
  auto over_cap = [&] { return clock.now_us() - begin >= cap_us; };

  for (int i = 0; i < config.warmup_calls && !over_cap(); ++i) {
    time_call(call, clock, timer, nullptr);
    ++profile.warmup_calls;
  }

  std::vector<double> host, device, window_means;
  const auto window = static_cast<std::size_t>(config.window_calls);
  while (true) {
    host.push_back(time_call(call, clock, timer, &device));

    if (host.size() % window == 0) {
      window_means.push_back(mean_of(host.end() - static_cast<std::ptrdiff_t>(window), host.end()));
      auto n = static_cast<std::size_t>(config.stable_windows);
      if (window_means.size() >= n) {
        auto [lo, hi] = std::minmax_element(window_means.end() - static_cast<std::ptrdiff_t>(n), window_means.end());
        if (*lo > 0 ? (*hi - *lo) / *lo <= config.stability : *hi == 0) {
          profile.stable = true;
          profile.stop_reason = "stable";
          break;
        }
      }
      if (window_means.size() >= static_cast<std::size_t>(config.max_windows)) {
        profile.stop_reason = "max windows";
        break;
      }
    }
    if (over_cap()) {
      profile.stop_reason = "time cap";
      break;
    }
  }
  profile.windows = static_cast<int>(window_means.size());
  profile.measured_calls = static_cast<int>(host.size());
  // Statistics over the last stable_windows complete windows: the calls the stability
  // verdict is about (earlier windows may still include warm-up effects).
  std::size_t used = std::min(window_means.size(), static_cast<std::size_t>(config.stable_windows)) * window;
  if (used == 0) used = host.size();
  std::size_t complete = window_means.size() * window;
  std::size_t end = complete > 0 ? complete : host.size();
  auto used_of = [&](const std::vector<double>& all) {
    return std::vector<double>(all.begin() + static_cast<std::ptrdiff_t>(end - used),
                               all.begin() + static_cast<std::ptrdiff_t>(end));
  };
  const std::vector<double> device_used = timer ? used_of(device) : std::vector<double>{};
  set_latencies(profile, used_of(host), timer ? &device_used : nullptr);
  profile.total_s = (clock.now_us() - begin) / 1e6;
  return profile;
}

Profile profile_calls(const std::function<void()>& call, int64_t batch_size, const ProfileConfig& config,
                      DeviceTimer* timer) {
  SteadyClock clock;
  return profile_calls(call, batch_size, config, clock, timer);
}

}  // namespace aitune
