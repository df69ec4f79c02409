// snapshot/peak_estimates: each re-simulated peak on hand-made series, on random ones against
// the series rebuilt from scratch allocation by allocation, past int64, and on bad positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "base/errors.hpp"
#include "snapshot/peak_estimates.hpp"

namespace stowage::snapshot {
namespace {

// A trace's positions: allocations and the frees that end them.
struct Trace {
  std::vector<std::uint8_t> is_alloc;
  std::vector<std::int64_t> end, size, live;
};

Trace random_trace(std::mt19937_64& rng, std::size_t n) {
  Trace t{std::vector<std::uint8_t>(n), std::vector<std::int64_t>(n, static_cast<std::int64_t>(n)),
          std::vector<std::int64_t>(n), std::vector<std::int64_t>(n)};
  std::vector<std::int64_t> own(n, 0);
  std::vector<std::size_t> live_allocs;
  for (std::size_t p = 0; p < n; ++p) {
    if (live_allocs.empty() || rng() % 2 == 0) {
      t.is_alloc[p] = 1;
      t.size[p] = static_cast<std::int64_t>(1 + rng() % 1000);
      own[p] = t.size[p];
      live_allocs.push_back(p);
    } else {
      const std::size_t k = rng() % live_allocs.size();
      const std::size_t ended = live_allocs[k];
      live_allocs.erase(live_allocs.begin() + static_cast<std::ptrdiff_t>(k));
      t.end[ended] = static_cast<std::int64_t>(p);
      t.size[p] = t.size[ended];
      own[p] = -t.size[ended];
    }
    t.live[p] = (p ? t.live[p - 1] : 500) + own[p];  // 500 bytes live before the trace
  }
  return t;
}

// The peak of the series with each allocation's life replaced by [from, to) where `lives` says.
std::int64_t rebuilt_peak(const Trace& t, const std::vector<std::pair<std::int64_t, std::int64_t>>& lives) {
  const std::size_t n = t.live.size();
  std::int64_t best = 0;
  for (std::size_t q = 0; q < n; ++q) {
    std::int64_t value = t.live[q];
    for (std::size_t p = 0; p < n; ++p) {
      if (t.is_alloc[p] == 0) continue;
      const auto s = static_cast<std::int64_t>(q);
      const bool was = static_cast<std::int64_t>(p) <= s && s < t.end[p];
      const bool is = lives[p].first <= s && s < lives[p].second;
      value += (is ? t.size[p] : 0) - (was ? t.size[p] : 0);
    }
    best = q == 0 ? value : std::max(best, value);
  }
  return best;
}

std::vector<std::pair<std::int64_t, std::int64_t>> own_lives(const Trace& t) {
  std::vector<std::pair<std::int64_t, std::int64_t>> lives(t.live.size());
  for (std::size_t p = 0; p < lives.size(); ++p) lives[p] = {static_cast<std::int64_t>(p), t.end[p]};
  return lives;
}

TEST(PeakEstimates, ChangedPeakAddsTheChangesRunningSum) {
  const std::vector<std::int64_t> live{5, 9, 4, 7};
  EXPECT_EQ(changed_peak(LiveSeries(std::span<const std::int64_t>(live)), std::vector<std::int64_t>{0, -6, 0, 8}), 9);
  EXPECT_EQ(changed_peak(LiveSeries(), std::vector<std::int64_t>{}), 0);
  EXPECT_THROW(changed_peak(LiveSeries(std::span<const std::int64_t>(live)), std::vector<std::int64_t>{1}), LogicError);
}

TEST(PeakEstimates, RemovedPeakEqualsTheSeriesRebuiltWithoutThem) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 150; ++round) {
    const Trace t = random_trace(rng, 1 + rng() % 60);
    auto lives = own_lives(t);
    std::vector<std::int64_t> removed;
    for (std::size_t p = 0; p < t.live.size(); ++p) {
      if (t.is_alloc[p] != 0 && rng() % 3 == 0) {
        removed.push_back(static_cast<std::int64_t>(p));
        lives[p] = {0, 0};
      }
    }
    EXPECT_EQ(removed_peak(LiveSeries(std::span<const std::int64_t>(t.live)), t.end, t.size, removed),
              rebuilt_peak(t, lives)) << "round " << round;
  }
}

TEST(PeakEstimates, FreedWhenMadePeakFreesEachKeptGroupWhenItsLastIsMade) {
  std::mt19937_64 rng(12);
  for (int round = 0; round < 150; ++round) {
    const Trace t = random_trace(rng, 2 + rng() % 60);
    const auto n = static_cast<std::int64_t>(t.live.size());
    std::vector<std::int64_t> kept, backward, starts;
    for (std::int64_t p = 0; p < n; ++p) {
      const auto u = static_cast<std::size_t>(p);
      if (t.is_alloc[u] != 0 && rng() % 3 == 0) kept.push_back(p);
      else if (t.is_alloc[u] != 0 && rng() % 4 == 0) backward.push_back(p);
      if (p > 0 && rng() % 15 == 0) starts.push_back(p);
    }
    // Groups: kept allocations with no backward allocation between them.
    auto lives = own_lives(t);
    const auto group = [&](std::int64_t p) { return std::count_if(backward.begin(), backward.end(), [p](auto b) { return b < p; }); };
    const bool split = !kept.empty() && group(kept.front()) != group(kept.back());
    for (std::size_t i = 0; i < kept.size(); ++i) {
      std::int64_t early = n;
      if (split) {
        std::size_t j = i;
        while (j + 1 < kept.size() && group(kept[j + 1]) == group(kept[i])) ++j;
        early = kept[j] + 1;
      } else {
        for (const std::int64_t s : starts) {
          if (s > kept[i]) { early = s; break; }
        }
      }
      const auto u = static_cast<std::size_t>(kept[i]);
      lives[u].second = std::min(early, t.end[u]);
    }
    EXPECT_EQ(freed_when_made_peak(LiveSeries(std::span<const std::int64_t>(t.live)), t.end, t.size, kept, backward,
                                   starts),
              rebuilt_peak(t, lives)) << "round " << round;
  }
}

TEST(PeakEstimates, GradientsSetToNoneGoAtTheirStepsEndAndLaterStepsKeepTheirOwn) {
  // Two steps of: forward alloc (freed), backward's gradient G (kept across steps in step 0;
  // in step 1, its own gradient g of the same size, freed in its step once added into G).
  //   0 alloc a   1 free a   2 alloc G (backward)  | 3 alloc a  4 free a  5 alloc g (backward)  6 free g
  const std::vector<std::uint8_t> is_alloc{1, 0, 1, 1, 0, 1, 0};
  const std::vector<std::int64_t> end{1, 7, 7, 4, 7, 6, 7};
  const std::vector<std::int64_t> size{10, 10, 100, 10, 10, 100, 100};
  const std::vector<std::int64_t> live{10, 0, 100, 110, 100, 200, 100};
  const std::vector<std::int64_t> kept{2}, backward{2, 5}, starts{3};
  // G goes at position 3; g lives from 5 to the trace's end: 10 (at 3), then 100 from 5.
  EXPECT_EQ(grads_set_to_none_peak(LiveSeries(std::span<const std::int64_t>(live)), is_alloc, end, size, kept, backward,
                                   starts),
            100);
  EXPECT_THROW(grads_set_to_none_peak(LiveSeries(std::span<const std::int64_t>(live)), is_alloc, end, size,
                                      std::vector<std::int64_t>{9}, backward, starts),
               LogicError);
  EXPECT_THROW(grads_set_to_none_peak(LiveSeries(std::span<const std::int64_t>(live)), is_alloc, end, size, kept,
                                      std::vector<std::int64_t>{5, 2}, starts),
               LogicError);
}

TEST(PeakEstimates, SeriesPastInt64AreCountedExactly) {
  const Wide big = Wide{1} << 70;
  const std::vector<Wide> live{big, big + 5, big - 3};
  const std::vector<std::int64_t> end{3, 3, 3}, size{5, 5, 5}, removed{1};
  EXPECT_TRUE(removed_peak(LiveSeries(std::span<const Wide>(live)), end, size, removed) == big);
  EXPECT_TRUE(changed_peak(LiveSeries(std::span<const Wide>(live)), std::vector<std::int64_t>{0, 0, 9}) == big + 6);
}

}  // namespace
}  // namespace stowage::snapshot
