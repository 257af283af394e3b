// Profiler logic with a scripted clock: warm-up excluded, stability windows, caps,
// percentiles, throughput, device timer.
#include <functional>
#include <stdexcept>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "aitune/profiler.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {
using namespace test;

// Time advances only when the profiled call says so.
class ScriptedClock final : public Clock {
 public:
  double now_us() override { return now_; }
  void advance(double us) { now_ += us; }

 private:
  double now_ = 0;
};

// Device time is a fixed fraction of the call's scripted host time.
class HalfTimer final : public DeviceTimer {
 public:
  explicit HalfTimer(const double& last) : last_(last) {}
  void start() override { ++starts; }
  void stop() override { ++stops; }
  double elapsed_us() override { return last_ / 2; }
  int starts = 0, stops = 0;

 private:
  const double& last_;
};

struct Scripted {
  ScriptedClock clock;
  int calls = 0;
  double last = 0;
  // duration(call index) in microseconds; index counts warm-up calls too.
  std::function<double(int)> duration;
  std::function<void()> call() {
    return [this] {
      last = duration(calls++);
      clock.advance(last);
    };
  }
};

ProfileConfig config(int warmup = 10) {
  ProfileConfig c;
  c.warmup_calls = warmup;
  c.window_calls = 25;
  c.stable_windows = 3;
  c.stability = 0.10;
  c.max_windows = 40;
  c.time_cap_s = 100;
  return c;
}

TEST(Profiler, WarmUpIsExcludedAndStableRunsStopAfterThreeWindows) {
  Scripted s;
  s.duration = [](int i) { return i < 10 ? 5000.0 : 100.0; };  // slow warm-up
  auto p = profile_calls(s.call(), 1, config(), s.clock);
  EXPECT_TRUE(p.stable);
  EXPECT_EQ(p.stop_reason, "stable");
  EXPECT_EQ(p.warmup_calls, 10);
  EXPECT_EQ(p.windows, 3);
  EXPECT_EQ(p.measured_calls, 75);
  EXPECT_EQ(s.calls, 85);
  EXPECT_DOUBLE_EQ(p.host_us.p50, 100);
  EXPECT_DOUBLE_EQ(p.host_us.mean, 100);
  EXPECT_DOUBLE_EQ(p.host_us.max, 100);
  EXPECT_DOUBLE_EQ(p.host_us.stddev, 0);
  EXPECT_FALSE(p.device_us.has_value());
}

TEST(Profiler, KeepsMeasuringUntilTheLastThreeWindowMeansAgree) {
  // Window means (after warm-up): 100, 200, 100, 150, 150, 150 -> stable after window 6.
  const double means[] = {100, 200, 100, 150, 150, 150, 999, 999};
  Scripted s;
  s.duration = [&](int i) { return means[(i) / 25]; };
  auto p = profile_calls(s.call(), 1, config(0), s.clock);
  EXPECT_TRUE(p.stable);
  EXPECT_EQ(p.windows, 6);
  EXPECT_EQ(p.host_us.count, 75u);  // statistics over the stable windows only
  EXPECT_DOUBLE_EQ(p.host_us.p50, 150);
  EXPECT_DOUBLE_EQ(p.host_us.min, 150);
}

TEST(Profiler, StabilityBoundIsRelativeToTheSmallestMean) {
  // Means 100, 109, 105 agree within 10 %; 100, 111 do not.
  const double agreeing[] = {100, 109, 105};
  Scripted a;
  a.duration = [&](int i) { return agreeing[std::min(i / 25, 2)]; };
  EXPECT_EQ(profile_calls(a.call(), 1, config(0), a.clock).windows, 3);
  const double apart[] = {100, 111, 105, 105, 105};
  Scripted b;
  b.duration = [&](int i) { return apart[std::min(i / 25, 4)]; };
  EXPECT_EQ(profile_calls(b.call(), 1, config(0), b.clock).windows, 4);  // 111, 105, 105
}

TEST(Profiler, TimeCapStopsAnUnstableRun) {
  Scripted s;
  s.duration = [](int i) { return 100.0 * (1 + (i / 25) % 2); };  // 100, 200, 100, ... never stable
  auto c = config(10);
  c.time_cap_s = 0.05;  // 50 ms = 500 calls of 100 us at most
  auto p = profile_calls(s.call(), 1, c, s.clock);
  EXPECT_FALSE(p.stable);
  EXPECT_EQ(p.stop_reason, "time cap");
  EXPECT_GE(p.total_s, 0.05);
  EXPECT_LT(p.total_s, 0.05 + 0.0002 + 1e-9);  // the call that crossed the cap is the last
  EXPECT_GT(p.host_us.count, 0u);
}

TEST(Profiler, TimeCapDuringWarmUpStillMeasuresOneCall) {
  Scripted s;
  s.duration = [](int) { return 1e6; };  // one second per call
  auto c = config(10);
  c.time_cap_s = 1.5;
  auto p = profile_calls(s.call(), 1, c, s.clock);
  EXPECT_EQ(p.warmup_calls, 2);
  EXPECT_EQ(p.measured_calls, 1);
  EXPECT_EQ(p.stop_reason, "time cap");
  EXPECT_DOUBLE_EQ(p.host_us.p50, 1e6);
}

TEST(Profiler, MaxWindowsStopsAnUnstableRun) {
  Scripted s;
  s.duration = [](int i) { return 100.0 * (1 + (i / 25) % 2); };
  auto c = config(0);
  c.max_windows = 7;
  auto p = profile_calls(s.call(), 1, c, s.clock);
  EXPECT_FALSE(p.stable);
  EXPECT_EQ(p.stop_reason, "max windows");
  EXPECT_EQ(p.windows, 7);
  EXPECT_EQ(p.measured_calls, 175);
}

TEST(Profiler, PercentilesAndThroughput) {
  // Each window holds 1..25 us: 75 samples, each value 3 times.
  Scripted s;
  s.duration = [](int i) { return static_cast<double>(i % 25 + 1); };
  auto p = profile_calls(s.call(), 8, config(0), s.clock);
  ASSERT_TRUE(p.stable);
  EXPECT_EQ(p.host_us.count, 75u);
  EXPECT_DOUBLE_EQ(p.host_us.p50, 13);
  EXPECT_DOUBLE_EQ(p.host_us.p90, 23);
  EXPECT_DOUBLE_EQ(p.host_us.p99, 25);
  EXPECT_DOUBLE_EQ(p.host_us.mean, 13);
  EXPECT_DOUBLE_EQ(p.host_us.min, 1);
  EXPECT_DOUBLE_EQ(p.throughput, 8 * 1e6 / 13);
}

TEST(Profiler, DeviceTimerIsStartedAndStoppedAroundEveryCall) {
  Scripted s;
  s.duration = [](int) { return 80.0; };
  HalfTimer timer(s.last);
  auto p = profile_calls(s.call(), 1, config(5), s.clock, &timer);
  ASSERT_TRUE(p.device_us.has_value());
  EXPECT_DOUBLE_EQ(p.device_us->p50, 40);
  EXPECT_EQ(timer.starts, s.calls);
  EXPECT_EQ(timer.stops, s.calls);
  auto j = nlohmann::json::parse(p.to_json());
  EXPECT_DOUBLE_EQ(j["device_us"]["p50"].get<double>(), 40);
  EXPECT_DOUBLE_EQ(j["host_us"]["p50"].get<double>(), 80);
}

TEST(Profiler, ExceptionsFromTheCallPropagate) {
  ScriptedClock clock;
  int n = 0;
  EXPECT_THROW(profile_calls([&] { if (++n == 3) throw std::runtime_error("boom"); }, 1, config(), clock),
               std::runtime_error);
}

TEST(Profiler, InvalidConfigNamesTheField) {
  ScriptedClock clock;
  auto c = config();
  c.window_calls = 0;
  expect_error([&] { profile_calls([] {}, 1, c, clock); }, ErrorCode::kInvalidArgument, {"window_calls"});
  c = config();
  c.max_windows = 2;
  expect_error([&] { profile_calls([] {}, 1, c, clock); }, ErrorCode::kInvalidArgument, {"max_windows"});
  expect_error([&] { profile_calls([] {}, 0, config(), clock); }, ErrorCode::kInvalidArgument, {"batch_size"});
}

}  // namespace
}  // namespace aitune
