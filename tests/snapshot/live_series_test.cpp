// snapshot/live_series: float comparisons as numpy and Python make them, and numpy's
// searchsorted over keys in turn, unsorted values included (the figures numpy 2.4 gives).
#include <gtest/gtest.h>

#include <vector>

#include "snapshot/live_series.hpp"

namespace stowage::snapshot {
namespace {

TEST(LiveSeries, ComparisonsWithAFloatAreNumpysInFloat64AndPythonsExactly) {
  const Wide value = (Wide{1} << 60) + 1;  // rounds to 2**60 as a float64
  EXPECT_TRUE(at_most(value, 0x1p60, false));
  EXPECT_FALSE(at_most(value, 0x1p60, true));
  EXPECT_TRUE(at_most(Wide{1} << 100, 0x1p100, true));
  EXPECT_FALSE(at_most(Wide{3}, 2.5, true));
}

TEST(LiveSeries, SearchesGiveNumpysAnswersEvenWhereTheValuesAreOutOfOrder) {
  const std::vector<std::int64_t> values{5, 20, 9, 30, 2, 40};
  const std::vector<std::int64_t> keys{10, 3, 25, 41, 0, 9, 9};
  NumpySearch right(values, true), left(values, false);
  std::vector<std::size_t> found_right, found_left;
  for (const std::int64_t key : keys) {
    found_right.push_back(right.next(key));
    found_left.push_back(left.next(key));
  }
  EXPECT_EQ(found_right, (std::vector<std::size_t>{1, 0, 3, 6, 0, 1, 3}));
  EXPECT_EQ(found_left, (std::vector<std::size_t>{1, 0, 3, 6, 0, 1, 1}));
  EXPECT_EQ(upper_index(values, 9), 1U);  // one key alone: a plain binary search
  const std::vector<std::int64_t> sorted{1, 3, 3, 8};
  NumpySearch in_order(sorted, true);
  for (const std::int64_t key : {8, 0, 3, 3, 9}) EXPECT_EQ(in_order.next(key), upper_index(sorted, key));
}

}  // namespace
}  // namespace stowage::snapshot
