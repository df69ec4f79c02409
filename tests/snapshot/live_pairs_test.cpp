// snapshot/live_pairs: frees matched with the allocations they end, on a hand-made trace and on
// random ones against a second pairing made the other way (events sorted by address, each free
// matched with the allocation just before it there), with the live bytes never negative.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "base/errors.hpp"
#include "snapshot/live_pairs.hpp"
#include "snapshot/names.hpp"

namespace stowage::snapshot {
namespace {

const std::uint8_t kAlloc = *action_code(Name::kAlloc);
const std::uint8_t kFree = *action_code(Name::kFreeCompleted);
const std::uint8_t kOom = *action_code(Name::kOom);

struct Pairs {
  std::vector<std::int32_t> index, alloc_of, end;
  std::vector<std::uint8_t> is_alloc;
  std::vector<std::int64_t> size, own, unknown;
};

std::size_t at_event(const Pairs& p, std::size_t position) { return static_cast<std::size_t>(p.index[position]); }

Pairs paired(const std::vector<std::uint8_t>& action, const std::vector<std::uint64_t>& addr,
             const std::vector<std::uint64_t>& size) {
  const std::size_t n = count_positions(action);
  Pairs out{std::vector<std::int32_t>(n), std::vector<std::int32_t>(n), std::vector<std::int32_t>(n),
            std::vector<std::uint8_t>(n), std::vector<std::int64_t>(n), std::vector<std::int64_t>(n),
            std::vector<std::int64_t>(n)};
  pair_allocations<std::int32_t>(action, addr, size,
                                 {out.index, out.is_alloc, out.size, out.own, out.unknown, out.alloc_of, out.end});
  return out;
}

TEST(LivePairs, FreesEndTheLatestAllocationOfTheirAddressUnlessAFreeCameBetween) {
  // 0: alloc A; 1: oom (no position); 2: free A; 3: free A again (unknown); 4: alloc B;
  // 5: alloc B again (the first never ended); 6: free B (ends the second).
  const std::vector<std::uint8_t> action{kAlloc, kOom, kFree, kFree, kAlloc, kAlloc, kFree};
  const std::vector<std::uint64_t> addr{16, 0, 16, 16, 32, 32, 32};
  const std::vector<std::uint64_t> size{100, 7, 100, 40, 8, 9, 9};
  const Pairs p = paired(action, addr, size);
  EXPECT_EQ(p.index, (std::vector<std::int32_t>{0, 2, 3, 4, 5, 6}));
  EXPECT_EQ(p.own, (std::vector<std::int64_t>{100, -100, 0, 8, 9, -9}));
  EXPECT_EQ(p.unknown, (std::vector<std::int64_t>{0, 0, 40, 0, 0, 0}));
  EXPECT_EQ(p.alloc_of, (std::vector<std::int32_t>{-1, 0, -1, -1, -1, 4}));
  EXPECT_EQ(p.end, (std::vector<std::int32_t>{1, 6, 6, 6, 5, 6}));
}

TEST(LivePairs, ColumnsOfUnequalLengthAreRefused) {
  std::vector<std::int64_t> none64;
  std::vector<std::int32_t> none32;
  std::vector<std::uint8_t> none8;
  const std::vector<std::uint8_t> action{kAlloc};
  EXPECT_THROW(pair_allocations<std::int32_t>(action, std::vector<std::uint64_t>{}, std::vector<std::uint64_t>{1},
                                              {none32, none8, none64, none64, none64, none32, none32}),
               LogicError);
}

TEST(LivePairs, RandomTracesPairAsEventsSortedByAddressDoAndLiveBytesStayNonNegative) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    const std::size_t events = rng() % 400;
    std::vector<std::uint8_t> action(events);
    std::vector<std::uint64_t> addr(events), size(events);
    for (std::size_t e = 0; e < events; ++e) {
      const std::uint64_t r = rng() % 10;
      action[e] = r < 5 ? kAlloc : r < 9 ? kFree : kOom;
      addr[e] = 4096 * (rng() % 12);
      size[e] = 1 + rng() % 5000;
    }
    const Pairs p = paired(action, addr, size);
    const std::size_t n = p.index.size();
    // The other way: positions sorted by address (stably), a free matched with an allocation
    // just before it at the same address.
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return addr[at_event(p, a)] < addr[at_event(p, b)]; });
    std::vector<std::int32_t> alloc_of(n, -1);
    for (std::size_t k = 1; k < n; ++k) {
      const std::size_t here = order[k], before = order[k - 1];
      if (addr[at_event(p, here)] == addr[at_event(p, before)] && p.is_alloc[here] == 0 && p.is_alloc[before] != 0) {
        alloc_of[here] = static_cast<std::int32_t>(before);
      }
    }
    ASSERT_EQ(p.alloc_of, alloc_of) << "round " << round;
    std::int64_t live = 0;
    for (std::size_t k = 0; k < n; ++k) {
      live += p.own[k];
      ASSERT_GE(live, 0) << "round " << round;
      if (p.alloc_of[k] >= 0) {
        EXPECT_EQ(p.end[static_cast<std::size_t>(p.alloc_of[k])], static_cast<std::int32_t>(k));
      }
      EXPECT_EQ(p.own[k] + p.unknown[k] == p.size[k], p.is_alloc[k] != 0 || p.alloc_of[k] < 0);
    }
  }
}

}  // namespace
}  // namespace stowage::snapshot
