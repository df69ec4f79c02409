#include "offload/reload_simulation.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/errors.hpp"

namespace stowage {

namespace {

// A wait shorter than this is rounding, not a stall: no clock measures it.
constexpr double kNegligibleStall = 1e-9;

}  // namespace

bool admits_within_window(std::size_t buffers_ahead, std::size_t bytes_ahead, std::size_t next_bytes,
                          std::size_t window_bytes, std::size_t max_bytes) noexcept {
  if (buffers_ahead == 0) return next_bytes <= max_bytes;  // one buffer ahead at least
  return bytes_ahead + next_bytes <= std::min(window_bytes, max_bytes);
}

PredictedStalls simulate_reloads(std::span<const ReloadUse> uses, double bandwidth, std::size_t window_bytes,
                                 std::size_t max_bytes) {
  STOWAGE_CHECK(bandwidth > 0 && std::isfinite(bandwidth), "a simulated link needs a positive bandwidth, not ",
                bandwidth);
  PredictedStalls out;
  std::vector<double> finished(uses.size(), 0.0);  // when each issued copy completes
  double now = 0;        // when the current use arrives
  double link_free = 0;  // when the last copy issued completes
  std::size_t next_issue = 0;  // uses before it were issued (or had nothing to copy)
  std::size_t buffers_ahead = 0;
  std::size_t bytes_ahead = 0;
  const auto issue = [&](std::size_t index) {
    link_free = std::max(now, link_free) + static_cast<double>(uses[index].copy_bytes) / bandwidth;
    finished[index] = link_free;
  };
  for (std::size_t i = 0; i < uses.size(); ++i) {
    const ReloadUse& use = uses[i];
    if (i < next_issue) {
      if (use.copy_bytes > 0) {  // it came back ahead of use: no longer ahead
        --buffers_ahead;
        bytes_ahead -= use.copy_bytes;
      }
    } else {
      if (use.copy_bytes > 0) issue(i);  // asked for now: copied first
      next_issue = i + 1;
    }
    for (; next_issue < uses.size(); ++next_issue) {
      const std::size_t bytes = uses[next_issue].copy_bytes;
      if (bytes == 0) continue;  // nothing to bring back
      if (!admits_within_window(buffers_ahead, bytes_ahead, bytes, window_bytes, max_bytes)) break;
      issue(next_issue);
      ++buffers_ahead;
      bytes_ahead += bytes;
      out.peak_ahead_bytes = std::max(out.peak_ahead_bytes, bytes_ahead);
    }
    const double stall = use.copy_bytes > 0 ? std::max(0.0, finished[i] - now) : 0.0;
    if (stall > kNegligibleStall) {
      ++out.count;
      out.seconds += stall;
    }
    now += stall + std::max(0.0, use.compute_seconds);
  }
  return out;
}

std::size_t choose_prefetch_window(std::span<const ReloadUse> uses, double bandwidth, std::size_t max_bytes,
                                   double copy_margin, double tolerance_seconds) {
  STOWAGE_CHECK(copy_margin >= 1 && std::isfinite(copy_margin), "a copy margin is at least 1, not ", copy_margin);
  const double slower = bandwidth / copy_margin;
  const double least_stall = simulate_reloads(uses, slower, max_bytes, max_bytes).seconds;
  const auto good_enough = [&](std::size_t window) {
    return simulate_reloads(uses, slower, window, max_bytes).seconds <= least_stall + tolerance_seconds;
  };
  // The stall never grows with the window (Note [Reload simulation]): the least window that is
  // good enough is found by bisection.
  std::size_t low = 0;  // the largest window known not good enough, or 0
  std::size_t high = max_bytes;
  if (good_enough(low)) return low;
  while (high - low > 1) {
    const std::size_t middle = low + (high - low) / 2;
    (good_enough(middle) ? high : low) = middle;
  }
  return high;
}

}  // namespace stowage
