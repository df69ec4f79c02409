#include "allocator/reserve_budget.hpp"

#include <algorithm>

#include "allocator/block_cache.hpp"

namespace stowage {

bool ReserveBudget::allows(std::size_t reserved, std::size_t request) const noexcept {
  const double in_use =
      static_cast<double>(std::max(cache_.active_high_water(), cache_.active_bytes() + request));
  return static_cast<double>(reserved) <=
         (1.0 + headroom_) * in_use + static_cast<double>(allowance_);
}

void ReserveBudget::note_churn(std::size_t bytes) noexcept {
  const std::size_t high_water = cache_.active_high_water();
  if (high_water != churn_high_water_) {
    churn_high_water_ = high_water;  // a new peak: the layout it needs is not known yet
    churn_ = 0;
  }
  if (bytes == 0) return;
  churn_ += bytes;
  if (8 * churn_ >= high_water) {
    allowance_ += std::max(granule_, high_water / 100);
    churn_ = 0;
  }
}

}  // namespace stowage
