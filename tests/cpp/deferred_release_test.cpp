// DeferredReleases: a CUDA session is destroyed only once its stream has drained
// (session/deferred_release.hpp). The drain is injected: no GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "session/deferred_release.hpp"

namespace aitune::detail {
namespace {

struct FakeStreams {
  std::set<std::uintptr_t> busy;  // streams whose wait fails now (capturing, or prohibited)
  std::vector<std::uintptr_t> waited;
  DeferredReleases releases{[this](std::uintptr_t s) {
    waited.push_back(s);
    return busy.count(s) == 0;
  }};
};

TEST(DeferredReleases, DestroysAtOnceWhenTheStreamDrains) {
  FakeStreams f;
  int destroyed = 0;
  f.releases.release(7, [&] { ++destroyed; });
  EXPECT_EQ(destroyed, 1);
  EXPECT_EQ(f.waited, std::vector<std::uintptr_t>{7});
  EXPECT_EQ(f.releases.parked(), 0u);
}

TEST(DeferredReleases, StreamZeroHasNothingToWaitFor) {
  FakeStreams f;
  int destroyed = 0;
  f.releases.release(0, [&] { ++destroyed; });
  EXPECT_EQ(destroyed, 1);
  EXPECT_TRUE(f.waited.empty());
}

// The Swin-T abort on the H200: a session released while its stream could not be waited
// for (a graph capture elsewhere) was deleted anyway, leaving a queued host function as
// its arena's last owner. It must stay alive until a later wait succeeds.
TEST(DeferredReleases, ParksAReleaseWhoseStreamCannotDrainAndRetriesItLater) {
  FakeStreams f;
  f.busy = {7};
  int destroyed = 0;
  f.releases.release(7, [&] { ++destroyed; });
  EXPECT_EQ(destroyed, 0) << "destroyed while its stream still had work queued";
  EXPECT_EQ(f.releases.parked(), 1u);
  EXPECT_EQ(f.releases.retry(), 1u);  // still busy: still parked
  EXPECT_EQ(destroyed, 0);
  f.busy.clear();
  EXPECT_EQ(f.releases.retry(), 0u);
  EXPECT_EQ(destroyed, 1);
  EXPECT_EQ(f.releases.retry(), 0u);
  EXPECT_EQ(destroyed, 1) << "a parked release ran twice";
}

TEST(DeferredReleases, AnotherReleaseRetriesTheParkedOnesFirst) {
  FakeStreams f;
  f.busy = {7};
  std::vector<int> order;
  f.releases.release(7, [&] { order.push_back(1); });
  f.busy.clear();
  f.releases.release(9, [&] { order.push_back(2); });
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_EQ(f.releases.parked(), 0u);
}

TEST(DeferredReleases, ADestroyMayReleaseAnotherSession) {
  // Tensors keep sessions alive: destroying one can drop the last owner of another.
  FakeStreams f;
  f.busy = {7};
  int inner = 0;
  f.releases.release(7, [&] { f.releases.release(8, [&] { ++inner; }); });
  f.busy.clear();
  EXPECT_EQ(f.releases.retry(), 0u);  // no deadlock on the releases' own lock
  EXPECT_EQ(inner, 1);
}

}  // namespace
}  // namespace aitune::detail
