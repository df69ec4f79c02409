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
  return admits_within_window(buffers_ahead, bytes_ahead, next_bytes, window_bytes(), max_bytes_);
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

bool MeasuredPrefetch::admits(std::size_t buffers_ahead, std::size_t bytes_ahead,
                              std::size_t next_bytes) const {
  if (!chosen_.has_value()) return before_measuring_.admits(buffers_ahead, bytes_ahead, next_bytes);
  return admits_within_window(buffers_ahead, bytes_ahead, next_bytes, *chosen_, max_bytes_);
}

void MeasuredPrefetch::observe(double lateness_seconds, double bandwidth) {
  before_measuring_.observe(lateness_seconds, bandwidth);
}

void MeasuredPrefetch::observe_pass(std::span<const ReloadUse> uses, double bandwidth) {
  if (!(bandwidth > 0) || !std::isfinite(bandwidth) || uses.empty()) return;  // nothing measured to go by
  double compute = 0;
  for (const ReloadUse& use : uses) compute += std::max(0.0, use.compute_seconds);
  chosen_ = choose_prefetch_window(uses, bandwidth, max_bytes_, kCopyMargin, kStallTolerance * compute);
}

std::size_t MeasuredPrefetch::window_bytes() const {
  return chosen_.has_value() ? *chosen_ : before_measuring_.window_bytes();
}

}  // namespace stowage
