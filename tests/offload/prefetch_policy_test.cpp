// How far ahead buffers come back (Note [Prefetch window]).
#include "offload/prefetch_policy.hpp"

#include <gtest/gtest.h>

#include "base/byte_units.hpp"

namespace stowage {
namespace {

TEST(FixedPrefetch, KeepsTheSetNumberOfBuffersAhead) {
  FixedPrefetch none(0);
  EXPECT_FALSE(none.admits(0, 0, kMiB));
  FixedPrefetch two(2);
  EXPECT_TRUE(two.admits(0, 0, kMiB));
  EXPECT_TRUE(two.admits(1, kMiB, kMiB));
  EXPECT_FALSE(two.admits(2, 2 * kMiB, kMiB));
}

TEST(AdaptivePrefetch, BeforeAnyMeasurementOneBufferIsBroughtAhead) {
  AdaptivePrefetch policy(64 * kMiB);
  EXPECT_TRUE(policy.admits(0, 0, 8 * kMiB));
  EXPECT_FALSE(policy.admits(1, 8 * kMiB, 8 * kMiB));
  EXPECT_FALSE(policy.admits(0, 0, 65 * kMiB)) << "a buffer larger than the window's bound";
}

TEST(AdaptivePrefetch, LateCopiesWidenTheWindowAndEarlyOnesNarrowIt) {
  AdaptivePrefetch policy(1024 * kMiB);
  const double bandwidth = 1e9;  // 1 GB/s
  policy.observe(0.010, bandwidth);  // a copy 10 ms late
  EXPECT_NEAR(policy.lead_seconds(), 0.010, 1e-12);
  EXPECT_NEAR(static_cast<double>(policy.window_bytes()), 10e6, 1.0);
  EXPECT_TRUE(policy.admits(1, 5'000'000, 5'000'000));
  EXPECT_FALSE(policy.admits(2, 10'000'000, 5'000'000));
  policy.observe(0.002, bandwidth);
  EXPECT_NEAR(policy.lead_seconds(), 0.012, 1e-12);
  policy.observe(-0.008, bandwidth);  // 8 ms early: a quarter of it is given up
  EXPECT_NEAR(policy.lead_seconds(), 0.010, 1e-12);
  for (int i = 0; i < 100; ++i) policy.observe(-0.010, bandwidth);
  EXPECT_EQ(policy.lead_seconds(), 0.0) << "copies always early: back to one buffer ahead";
  EXPECT_EQ(policy.window_bytes(), 0u);
}

TEST(AdaptivePrefetch, TheWindowFollowsTheLinkAndStaysWithinItsBound) {
  AdaptivePrefetch policy(16 * kMiB);
  policy.observe(0.5, 1e9);
  EXPECT_EQ(policy.window_bytes(), 16 * kMiB) << "bounded";
  AdaptivePrefetch slow(1024 * kMiB);
  slow.observe(0.010, 1e8);
  AdaptivePrefetch fast(1024 * kMiB);
  fast.observe(0.010, 1e10);
  EXPECT_EQ(fast.window_bytes(), 100 * slow.window_bytes());
}

TEST(MeasuredPrefetch, FollowsTheAdaptiveLeadUntilAPassIsMeasured) {
  MeasuredPrefetch policy(1024 * kMiB);
  EXPECT_TRUE(policy.admits(0, 0, 8 * kMiB));
  EXPECT_FALSE(policy.admits(1, 8 * kMiB, 8 * kMiB)) << "one buffer ahead before any measurement";
  policy.observe(0.020, 1e9);  // 20 ms late at 1 GB/s: a 20 MB window
  EXPECT_EQ(policy.window_bytes(), 20'000'000u);
  EXPECT_FALSE(policy.chosen_window().has_value());
  const ReloadUse uses[] = {{10'000'000, 0.030}, {10'000'000, 0.0}};
  policy.observe_pass(uses, 0.0);
  EXPECT_FALSE(policy.chosen_window().has_value()) << "no bandwidth measured: nothing to go by";
}

TEST(MeasuredPrefetch, AMeasuredPassChoosesTheWindowAndLatenessNoLongerMovesIt) {
  MeasuredPrefetch policy(1024 * kMiB);
  policy.observe(0.500, 1e9);  // the first pass was very late: a wide adaptive window
  EXPECT_EQ(policy.window_bytes(), 500'000'000u);
  // Ten-ms copies (at 1 GB/s) behind a long compute and two short ones, as in
  // reload_simulation_test: planned 1.25x slower, three buffers ahead hide them.
  const std::size_t ten = 10'000'000;
  const ReloadUse uneven[] = {{ten, 0.030}, {ten, 0.005}, {ten, 0.005}, {ten, 0.030}, {ten, 0.0}};
  policy.observe_pass(uneven, 1e9);
  ASSERT_TRUE(policy.chosen_window().has_value());
  EXPECT_EQ(policy.window_bytes(), 3 * ten);
  EXPECT_TRUE(policy.admits(2, 2 * ten, ten));
  EXPECT_FALSE(policy.admits(3, 3 * ten, ten));
  policy.observe(0.100, 1e9);
  EXPECT_EQ(policy.window_bytes(), 3 * ten) << "the measured window stays until the next pass";
  const ReloadUse slack[] = {{ten, 0.050}, {ten, 0.050}, {ten, 0.0}};
  policy.observe_pass(slack, 1e9);
  EXPECT_EQ(policy.window_bytes(), 0u) << "long computes: one buffer ahead is enough";
  EXPECT_TRUE(policy.admits(0, 0, ten));
  EXPECT_FALSE(policy.admits(1, ten, ten));
}

TEST(MeasuredPrefetch, TheChosenWindowStaysWithinItsBound) {
  MeasuredPrefetch policy(15'000'000);
  const std::size_t ten = 10'000'000;
  const ReloadUse tight[] = {{ten, 0.001}, {ten, 0.001}, {ten, 0.001}, {ten, 0.0}};
  policy.observe_pass(tight, 1e9);
  EXPECT_LE(policy.window_bytes(), 15'000'000u);
  EXPECT_FALSE(policy.admits(1, ten, ten));
}

}  // namespace
}  // namespace stowage
