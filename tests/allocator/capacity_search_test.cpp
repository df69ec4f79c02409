#include "allocator/capacity_search.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

namespace stowage {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kStep = 2 * kMiB;

// A replay that completes from `threshold` bytes up, recording every capacity asked.
struct Threshold {
  std::uint64_t threshold;
  std::vector<std::uint64_t> asked;
  bool operator()(std::uint64_t capacity) {
    asked.push_back(capacity);
    return capacity >= threshold;
  }
};

TEST(CapacitySearch, FindsTheFirstStepAtOrAboveTheThresholdAndVerifiesIt) {
  Threshold fits{1000 * kMiB + 1, {}};
  const auto found = search_min_capacity(std::ref(fits), 600 * kMiB, std::nullopt);
  ASSERT_TRUE(found.min_capacity);
  EXPECT_EQ(*found.min_capacity, 1002 * kMiB);
  EXPECT_TRUE(found.verified);
  for (const std::uint64_t capacity : fits.asked) EXPECT_EQ(capacity % kStep, 0u) << capacity;
}

TEST(CapacitySearch, StartsFromAKnownFitAndCountsTheBisectionAndTheTwoChecks) {
  Threshold fits{300 * kMiB, {}};
  // peak 256 MiB: low is 127 steps; the known fit (rounded up to 160 steps) brackets it.
  const auto found = search_min_capacity(std::ref(fits), 256 * kMiB, 319 * kMiB);
  EXPECT_EQ(fits.asked.front(), 320 * kMiB);
  ASSERT_TRUE(found.min_capacity);
  EXPECT_EQ(*found.min_capacity, 300 * kMiB);
  // 127 to 160 steps bisected in 5 replays (143, 151, 147, 149, 150); then the check at 150
  // steps, the walk's try at 149 and the check that 149 fails.
  EXPECT_EQ(found.replays, 5u + 2u);
  EXPECT_EQ(fits.asked.size(), 1u + 5u + 3u);
}

TEST(CapacitySearch, AReplayThatFitsBelowTheBisectionsAnswerIsFollowedDown) {
  // Fits at 100 steps and above, and also at 60 to 90 steps: not monotone.
  std::vector<std::uint64_t> asked;
  const auto fits = [&](std::uint64_t capacity) {
    asked.push_back(capacity);
    const std::uint64_t steps = capacity / kStep;
    return steps >= 100 || (steps >= 60 && steps <= 90);
  };
  const auto found = search_min_capacity(fits, 50 * kStep, 100 * kStep);
  ASSERT_TRUE(found.min_capacity);
  EXPECT_EQ(*found.min_capacity % kStep, 0u);
  EXPECT_TRUE(fits(*found.min_capacity));
  EXPECT_FALSE(fits(*found.min_capacity - kStep));
  EXPECT_TRUE(found.verified);
}

TEST(CapacitySearch, NothingFitsUpToTheLargestDevice) {
  Threshold fits{std::uint64_t{1} << 62, {}};
  const CapacitySearchLimits limits{kStep, 64 * kStep};
  const auto found = search_min_capacity(std::ref(fits), 5 * kStep, std::nullopt, limits);
  EXPECT_FALSE(found.min_capacity);
  EXPECT_FALSE(found.verified);
  EXPECT_EQ(found.replays, 0u);
  for (const std::uint64_t capacity : fits.asked) EXPECT_LE(capacity, 64 * kStep);
}

TEST(CapacitySearch, ATraceThatRequestsNothingHasNoSmallestDevice) {
  Threshold fits{0, {}};
  const auto found = search_min_capacity(std::ref(fits), 0, std::nullopt);
  EXPECT_FALSE(found.min_capacity);
  EXPECT_TRUE(fits.asked.empty());
}

TEST(CapacitySearch, AReplayThatStopsFittingWhenCheckedIsNotVerified) {
  // Fits from 10 steps while searching; the verifying replay at the answer fails.
  int calls = 0;
  const auto fits = [&](std::uint64_t capacity) {
    ++calls;
    return capacity >= 10 * kStep && calls < 5;
  };
  const auto found = search_min_capacity(fits, 3 * kStep, std::nullopt);
  ASSERT_TRUE(found.min_capacity);
  EXPECT_FALSE(found.verified);
}

TEST(CapacitySearch, ProgressCountsTheBisectionUpToItsTotal) {
  Threshold fits{777 * kMiB, {}};
  std::vector<std::pair<std::uint64_t, std::uint64_t>> seen;
  search_min_capacity(std::ref(fits), 100 * kMiB, std::nullopt, {},
                      [&](std::uint64_t done, std::uint64_t total) { seen.emplace_back(done, total); });
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front().first, 0u);
  for (std::size_t i = 1; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].first, i);
    EXPECT_LE(seen[i].first, seen[i].second);
  }
}

TEST(CapacitySearch, BadLimitsAreRefused) {
  Threshold fits{0, {}};
  EXPECT_THROW(search_min_capacity(std::ref(fits), 1, std::nullopt, {0, kStep}), std::exception);
}

TEST(CapacitySearch, RandomDevicesWithHolesGiveAFitWithNoFitOneStepBelow) {
  std::mt19937_64 random(7);
  for (int round = 0; round < 500; ++round) {
    const std::uint64_t threshold = 1 + random() % (4000 * kStep);
    std::set<std::uint64_t> holes;  // steps above the threshold that do not fit
    for (int i = 0; i < 5; ++i) holes.insert(threshold / kStep + 1 + random() % 200);
    const auto fits = [&](std::uint64_t capacity) {
      EXPECT_EQ(capacity % kStep, 0u);
      return capacity >= threshold && !holes.contains(capacity / kStep);
    };
    const std::uint64_t peak = 1 + random() % threshold;
    const std::optional<std::uint64_t> known =
        random() % 2 ? std::optional<std::uint64_t>(threshold + random() % (300 * kStep)) : std::nullopt;
    const auto found = search_min_capacity(fits, peak, known);
    ASSERT_TRUE(found.min_capacity) << round;
    EXPECT_TRUE(fits(*found.min_capacity)) << round;
    if (*found.min_capacity > kStep) {
      EXPECT_FALSE(fits(*found.min_capacity - kStep)) << round;
    }
    EXPECT_TRUE(found.verified) << round;
    EXPECT_GE(found.replays, 2u);
  }
}

}  // namespace
}  // namespace stowage
