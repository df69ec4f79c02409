#include "snapshot/live_series.hpp"

#include <algorithm>
#include <cmath>

#include "base/errors.hpp"

namespace stowage::snapshot {

bool at_most(Wide value, double bound, bool exact) {
  if (!exact) return static_cast<double>(value) <= bound;
  if (std::isnan(bound)) return false;
  constexpr double kWideLimit = 0x1p126;  // beyond any sum of positions' sizes
  if (bound >= kWideLimit) return true;
  if (bound <= -kWideLimit) return false;
  return value <= static_cast<Wide>(std::floor(bound));  // an integer is at most x iff at most floor(x)
}

std::size_t lower_index(std::span<const std::int64_t> values, std::int64_t value) {
  return static_cast<std::size_t>(std::lower_bound(values.begin(), values.end(), value) - values.begin());
}

std::size_t upper_index(std::span<const std::int64_t> values, std::int64_t value) {
  return static_cast<std::size_t>(std::upper_bound(values.begin(), values.end(), value) - values.begin());
}

std::size_t NumpySearch::next(std::int64_t key) {
  // numpy's binsearch: a key after a larger one searches from the start again, else on from
  // where the last one ended.
  if (!started_) {
    high_ = values_.size();
    last_key_ = key;
    started_ = true;
  }
  if (before(last_key_, key)) {
    high_ = values_.size();
  } else {
    low_ = 0;
    high_ = high_ < values_.size() ? high_ + 1 : values_.size();
  }
  last_key_ = key;
  while (low_ < high_) {
    const std::size_t middle = low_ + ((high_ - low_) >> 1);
    if (before(values_[middle], key)) {
      low_ = middle + 1;
    } else {
      high_ = middle;
    }
  }
  return low_;
}

void check_positions(std::span<const std::int64_t> values, std::int64_t limit, const char* what, bool sorted) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    STOWAGE_CHECK(values[i] >= 0 && values[i] <= limit, what, ": ", values[i], " at ", i, " is outside 0..", limit);
    STOWAGE_CHECK(!sorted || i == 0 || values[i - 1] <= values[i], what, " are not in ascending order (at ", i, ")");
  }
}

}  // namespace stowage::snapshot
