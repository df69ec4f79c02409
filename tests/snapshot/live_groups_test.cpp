// snapshot/live_groups: live bytes by group, sampled, on a hand-made trace and, on random ones,
// summing over the groups to the trace's own live bytes at every sample.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "base/errors.hpp"
#include "snapshot/live_groups.hpp"

namespace stowage::snapshot {
namespace {

TEST(LiveGroups, AFreeLeavesItsAllocationsGroupAndThePeakIsSampled) {
  // 0 alloc 10 (group 0), 1 alloc 5 (group 1), 2 free of 0, 3 unknown free of 7, 4 alloc 1 (group 9: none)
  const std::vector<std::int64_t> own{10, 5, -10, 0, 1}, unknown{0, 0, 0, 7, 0}, alloc_of{-1, -1, 0, -1, -1};
  const std::vector<std::uint8_t> is_alloc{1, 1, 0, 0, 1};
  const std::vector<std::int64_t> group{0, 1, 1, 0, 9};
  const GroupedLive found = grouped_live(own, unknown, is_alloc, alloc_of, group, 2, 2);
  EXPECT_EQ(found.peak, 1);
  EXPECT_EQ(found.positions, (std::vector<std::int64_t>{0, 1, 3, 4}));  // stride 3, the peak, the last
  ASSERT_EQ(found.series.size(), 2U);
  EXPECT_TRUE(found.series[0] == (std::vector<Wide>{10, 10, 0, 0}));
  EXPECT_TRUE(found.series[1] == (std::vector<Wide>{0, 5, 5, 5}));
  EXPECT_TRUE(found.unknown_freed == (std::vector<Wide>{0, 0, 7, 7}));
  EXPECT_THROW(grouped_live(own, unknown, is_alloc, std::vector<std::int64_t>{-1, -1, 5, -1, -1}, group, 2, 2),
               LogicError);
}

TEST(LiveGroups, RandomTracesGroupsSumToTheTracesOwnLiveBytes) {
  std::mt19937_64 rng(4);
  for (int round = 0; round < 100; ++round) {
    const std::size_t n = 1 + rng() % 300;
    std::vector<std::int64_t> own(n), unknown(n, 0), alloc_of(n, -1), group(n);
    std::vector<std::uint8_t> is_alloc(n);
    std::vector<std::size_t> open;
    for (std::size_t p = 0; p < n; ++p) {
      group[p] = static_cast<std::int64_t>(rng() % 4);
      if (open.empty() || rng() % 2 == 0) {
        is_alloc[p] = 1;
        own[p] = static_cast<std::int64_t>(rng() % 100);
        open.push_back(p);
      } else {
        const std::size_t k = rng() % open.size();
        alloc_of[p] = static_cast<std::int64_t>(open[k]);
        own[p] = -own[open[k]];
        open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    const GroupedLive found = grouped_live(own, unknown, is_alloc, alloc_of, group, 4, 1 + rng() % 50);
    // live_at at each sample agrees: its bytes are the group's, its allocations those live.
    std::vector<std::int64_t> end(n, static_cast<std::int64_t>(n)), size(n);
    for (std::size_t p = 0; p < n; ++p) {
      size[p] = own[p] < 0 ? -own[p] : own[p];
      if (alloc_of[p] >= 0) end[static_cast<std::size_t>(alloc_of[p])] = static_cast<std::int64_t>(p);
    }
    for (std::size_t j = 0; j < found.positions.size(); ++j) {
      const LiveAt live = live_at(is_alloc, end, size, group, 4, found.positions[j]);
      for (std::size_t k = 0; k < 4; ++k) EXPECT_TRUE(live.bytes[k] == found.series[k][j]) << "round " << round;
    }
    for (std::size_t j = 0; j < found.positions.size(); ++j) {
      Wide expected = 0, summed = 0;
      for (std::int64_t p = 0; p <= found.positions[j]; ++p) expected += own[static_cast<std::size_t>(p)];
      for (const auto& series : found.series) {
        ASSERT_TRUE(series[j] >= 0);
        summed += series[j];
      }
      EXPECT_TRUE(summed == expected) << "round " << round;
    }
  }
}

TEST(LiveGroups, AGroupGrowingAtEveryStepEndIsFoundWithItsGrowthAStep) {
  // Positions: group 0 keeps 10 B a step (p0, p2, p4, p6); group 1 allocates 50 B each step and
  // frees it (p1/p3, ...), group 2 grows but not at the last end. Step ends at p1, p3, p5, p7.
  const std::vector<std::uint8_t> is_alloc = {1, 1, 1, 0, 1, 1, 1, 0};
  const std::vector<std::int64_t> end = {8, 3, 8, 8, 8, 7, 8, 8};
  const std::vector<std::int64_t> size = {10, 50, 10, 50, 10, 7, 13, 7};
  const std::vector<std::int64_t> group = {0, 1, 0, -1, 0, 2, 0, -1};
  const std::vector<std::int64_t> first = {0, 1, 5};
  const std::vector<std::int64_t> ends = {1, 3, 5, 7};
  const std::vector<Growing> found = growing_groups(is_alloc, end, size, group, first, ends);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].group, 0);
  EXPECT_EQ(found[0].bytes_per_step, 11);  // 10, 20, 30, 43: 33 over 3 steps
  EXPECT_EQ(found[0].steps, 4);
  // Before any event nothing is live: growth from there counts.
  const std::vector<std::int64_t> from_start = {-1, 1, 3};
  const std::vector<Growing> early = growing_groups(is_alloc, end, size, group, first, from_start);
  ASSERT_EQ(early.size(), 1u);
  EXPECT_EQ(early[0].bytes_per_step, 10);
  const std::vector<std::int64_t> bad = {-2};
  EXPECT_THROW(growing_groups(is_alloc, end, size, group, first, bad), LogicError);
}

}  // namespace
}  // namespace stowage::snapshot
