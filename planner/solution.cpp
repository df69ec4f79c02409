#include "planner/solution.hpp"

#include <cmath>

namespace stowage::planner {

bool better_outcome(const Simulation& a, const Simulation& b, std::uint64_t budget) {
  const bool a_fits = a.peak_bytes <= budget, b_fits = b.peak_bytes <= budget;
  if (a_fits != b_fits) return a_fits;
  if (!a_fits) return a.peak_bytes < b.peak_bytes;
  constexpr double kSameTime = 1e-9;
  if (std::abs(a.step_ms - b.step_ms) > kSameTime) return a.step_ms < b.step_ms;
  return a.peak_bytes < b.peak_bytes;
}

}  // namespace stowage::planner
