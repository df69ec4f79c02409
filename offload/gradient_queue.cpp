#include "offload/gradient_queue.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "base/errors.hpp"

namespace stowage::offload {

std::uint64_t GradientQueue::send(std::size_t bytes) {
  bytes_.push_back(bytes);
  total_ += bytes;
  peak_ = std::max(peak_, total_);
  return next_++;
}

std::size_t GradientQueue::over_bound() const {
  std::size_t count = 0;
  std::size_t staying = total_;
  while (staying > bound_bytes_ && count + 1 < bytes_.size()) {
    staying -= bytes_[count];
    ++count;
  }
  return count;
}

void GradientQueue::land(std::uint64_t ticket) {
  const std::optional<std::uint64_t> first = oldest();
  STOWAGE_CHECK(first.has_value() && *first == ticket, "gradient ", ticket, " landed, but the oldest in flight is ",
                first.has_value() ? std::to_string(*first) : std::string("none"));
  total_ -= bytes_.front();
  bytes_.pop_front();
}

std::optional<std::uint64_t> GradientQueue::oldest() const {
  if (bytes_.empty()) return std::nullopt;
  return next_ - bytes_.size();
}

void GradientQueue::check_invariants() const {
  STOWAGE_INTERNAL_ASSERT(std::accumulate(bytes_.begin(), bytes_.end(), std::size_t{0}) == total_);
  STOWAGE_INTERNAL_ASSERT(bytes_.size() <= next_);
  STOWAGE_INTERNAL_ASSERT(total_ <= peak_);
}

}  // namespace stowage::offload
