#include "allocator/capacity_search.hpp"

#include <algorithm>
#include <bit>

#include "base/errors.hpp"

namespace stowage {

namespace {

// The first step count (low exclusive, high inclusive) bracketing the smallest fit: high fits,
// low cannot. None when nothing up to the limit fits.
std::optional<std::pair<std::uint64_t, std::uint64_t>> bracket(
    const std::function<bool(std::uint64_t)>& fits, std::uint64_t peak_requested,
    std::optional<std::uint64_t> known_fit, const CapacitySearchLimits& limits) {
  const std::uint64_t step = limits.step;
  const std::uint64_t most_steps = limits.max_capacity / step;
  std::uint64_t low = (peak_requested - 1) / step;  // cannot hold the live requested bytes
  if (known_fit) {
    const std::uint64_t steps = *known_fit / step + (*known_fit % step != 0 ? 1 : 0);
    if (fits(steps * step)) return std::pair{low, steps};
  }
  std::uint64_t high = std::max(low + 1, 2 * (low + 1));
  while (high > most_steps || !fits(high * step)) {
    if (high >= most_steps) return std::nullopt;
    low = high;
    high = std::min(2 * high, most_steps);
  }
  return std::pair{low, high};
}

}  // namespace

CapacitySearchResult search_min_capacity(
    const std::function<bool(std::uint64_t)>& fits, std::uint64_t peak_requested,
    std::optional<std::uint64_t> known_fit, const CapacitySearchLimits& limits,
    const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  STOWAGE_CHECK(limits.step > 0 && limits.max_capacity >= limits.step,
                "a capacity search needs a step above 0 and a largest capacity of one step at least");
  if (peak_requested == 0) return {};
  const auto bracketed = bracket(fits, peak_requested, known_fit, limits);
  if (!bracketed) return {};
  auto [low, high] = *bracketed;
  const std::uint64_t step = limits.step;
  std::uint64_t replays = 0;
  // bit_width returns int since C++20's LWG 3656 (libstdc++ 13), T before: cast either way.
  const auto total = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::bit_width(high - low)));
  if (progress) progress(0, total);
  while (high - low > 1) {
    const std::uint64_t middle = low + (high - low) / 2;
    ++replays;
    (fits(middle * step) ? high : low) = middle;
    if (progress) progress(replays, total);
  }
  const bool fits_at = fits(high * step);
  while (high > 1 && fits((high - 1) * step)) {
    --high;
    ++replays;
  }
  const bool fails_below = high > 1 ? !fits((high - 1) * step) : true;
  return {high * step, fits_at && fails_below, replays + 2};
}

}  // namespace stowage
