// A backward's reloads replayed on paper, and the least window without stalls
// (Note [Reload simulation]).
#include "offload/reload_simulation.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "base/errors.hpp"

namespace stowage {
namespace {

constexpr double kGBps = 1e9;
constexpr std::size_t kTenMB = 10'000'000;  // 10 ms at 1 GB/s
constexpr std::size_t kBound = std::size_t{1} << 30;

// Five buffers of 10 ms each: a long compute, two short ones, a long one.
std::vector<ReloadUse> uneven_pass() {
  return {{kTenMB, 0.030}, {kTenMB, 0.005}, {kTenMB, 0.005}, {kTenMB, 0.030}, {kTenMB, 0.0}};
}

TEST(ReloadSimulation, OneBufferAheadStallsBehindShortComputes) {
  // Use 0 copies first (10 ms), use 1 came ahead; use 2's copy, issued at use 1 (40 ms) after
  // use 1's, lands 5 ms after use 2 arrives (45 ms); use 3's, issued at use 2's arrival, 5 ms late.
  const PredictedStalls stalls = simulate_reloads(uneven_pass(), kGBps, 0, kBound);
  EXPECT_EQ(stalls.count, 3u);
  EXPECT_NEAR(stalls.seconds, 0.020, 1e-12);
  EXPECT_EQ(stalls.peak_ahead_bytes, kTenMB);
}

TEST(ReloadSimulation, TwoBuffersAheadLeaveOnlyTheFirstUse) {
  const PredictedStalls stalls = simulate_reloads(uneven_pass(), kGBps, 2 * kTenMB, kBound);
  EXPECT_EQ(stalls.count, 1u) << "the first use's own copy cannot be hidden";
  EXPECT_NEAR(stalls.seconds, 0.010, 1e-12);
  EXPECT_EQ(stalls.peak_ahead_bytes, 2 * kTenMB);
}

TEST(ReloadSimulation, TheWindowNeverPassesItsBoundButOneBufferAlwaysComes) {
  const PredictedStalls bounded = simulate_reloads(uneven_pass(), kGBps, 4 * kTenMB, kTenMB);
  EXPECT_EQ(bounded.peak_ahead_bytes, kTenMB);
  const PredictedStalls none = simulate_reloads(uneven_pass(), kGBps, 0, kTenMB - 1);
  EXPECT_EQ(none.peak_ahead_bytes, 0u) << "a buffer over the bound comes back only when used";
  EXPECT_EQ(none.count, 5u);
}

TEST(ReloadSimulation, UsesWithNothingToCopyNeverStallAndAreNotPrefetched) {
  const std::vector<ReloadUse> uses = {{0, 0.001}, {kTenMB, 0.050}, {0, 0.0}, {kTenMB, 0.0}};
  const PredictedStalls stalls = simulate_reloads(uses, kGBps, 0, kBound);
  // Use 0 brings use 1 ahead (lands at 10 ms, 9 ms late); use 1 brings use 3 ahead, past use 2.
  EXPECT_EQ(stalls.count, 1u);
  EXPECT_NEAR(stalls.seconds, 0.009, 1e-12);
}

TEST(ReloadSimulation, ChoosesTheLeastWindowWithoutAvoidableStalls) {
  EXPECT_EQ(choose_prefetch_window(uneven_pass(), kGBps, kBound, 1.0, 1e-9), 2 * kTenMB);
  // Copies planned 1.2x slower: 12 ms each; the two short computes then need three ahead.
  const std::size_t wider = choose_prefetch_window(uneven_pass(), kGBps, kBound, 1.2, 1e-9);
  EXPECT_EQ(wider, 3 * kTenMB);
  EXPECT_EQ(choose_prefetch_window(uneven_pass(), kGBps, kTenMB, 1.0, 1e-9), 0u)
      << "bounded by one buffer, every window brings one buffer ahead: the least is 0";
  const std::vector<ReloadUse> slack = {{kTenMB, 0.050}, {kTenMB, 0.050}, {kTenMB, 0.0}};
  EXPECT_EQ(choose_prefetch_window(slack, kGBps, kBound, 1.25, 1e-9), 0u) << "one ahead hides every copy";
}

TEST(ReloadSimulation, RejectsAnUnknownLinkAndAMarginBelowOne) {
  EXPECT_THROW(simulate_reloads(uneven_pass(), 0.0, 0, kBound), Error);
  EXPECT_THROW(choose_prefetch_window(uneven_pass(), kGBps, kBound, 0.5, 0.0), Error);
}

// Random passes: a wider window never predicts more stall, never holds more than its bound (or
// the one buffer ahead), and the chosen window predicts the widest window's stall.
TEST(ReloadSimulation, RandomPassesStallNoMoreWithAWiderWindow) {
  std::mt19937 random(7);
  std::uniform_int_distribution<std::size_t> bytes(0, 4 * kTenMB);
  std::uniform_real_distribution<double> compute(0.0, 0.040);
  for (int pass = 0; pass < 200; ++pass) {
    std::vector<ReloadUse> uses(1 + random() % 40);
    std::size_t largest = 0;
    for (ReloadUse& use : uses) {
      use = {random() % 4 == 0 ? 0 : bytes(random), compute(random)};
      largest = std::max(largest, use.copy_bytes);
    }
    const std::size_t bound = kTenMB * (1 + random() % 12);
    double previous = simulate_reloads(uses, kGBps, 0, bound).seconds;
    for (std::size_t window = kTenMB / 2; window <= 16 * kTenMB; window += kTenMB / 2) {
      const PredictedStalls stalls = simulate_reloads(uses, kGBps, window, bound);
      ASSERT_LE(stalls.seconds, previous + 1e-12) << "pass " << pass << ", window " << window;
      ASSERT_LE(stalls.peak_ahead_bytes, std::max(std::min(window, bound), largest));
      previous = stalls.seconds;
    }
    const std::size_t chosen = choose_prefetch_window(uses, kGBps, bound, 1.0, 1e-9);
    ASSERT_LE(chosen, bound);
    ASSERT_LE(simulate_reloads(uses, kGBps, chosen, bound).seconds,
              simulate_reloads(uses, kGBps, bound, bound).seconds + 1e-9);
    if (chosen > 0) {
      ASSERT_GT(simulate_reloads(uses, kGBps, chosen - 1, bound).seconds,
                simulate_reloads(uses, kGBps, bound, bound).seconds + 1e-9)
          << "the least such window";
    }
  }
}

}  // namespace
}  // namespace stowage
