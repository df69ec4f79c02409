#include "offload/prefetch_policy.hpp"

#include <algorithm>
#include <cmath>

namespace stowage {

namespace {

// Of a copy's earliness, the part the lead gives up: earliness varies from buffer to buffer, so the
// lead comes down slowly and goes up at once.
constexpr double kSlackGivenUp = 0.25;

}  // namespace

bool AdaptivePrefetch::admits(std::size_t buffers_ahead, std::size_t bytes_ahead,
                              std::size_t next_bytes) const {
  if (buffers_ahead == 0) return next_bytes <= max_bytes_;  // one buffer ahead at least
  return bytes_ahead + next_bytes <= window_bytes();
}

void AdaptivePrefetch::observe(double lateness_seconds, double bandwidth) {
  if (bandwidth > 0) bandwidth_ = bandwidth;
  if (lateness_seconds > 0) {
    lead_ += lateness_seconds;
  } else {
    lead_ = std::max(0.0, lead_ + kSlackGivenUp * lateness_seconds);
  }
}

std::size_t AdaptivePrefetch::window_bytes() const {
  const double bytes = std::min(lead_ * bandwidth_, static_cast<double>(max_bytes_));
  return bytes > 0 ? static_cast<std::size_t>(std::llround(bytes)) : 0;
}

}  // namespace stowage
