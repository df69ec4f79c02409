#include "planner/prefetch_search.hpp"

#include <optional>

#include "base/errors.hpp"
#include "planner/exhaustive_solver.hpp"
#include "planner/greedy_solver.hpp"
#include "planner/simulator.hpp"

namespace stowage::planner {

DepthSolution solve_over_depths(const LifetimeTrace& trace, const CostModel& cost, std::uint64_t budget, bool exact,
                                std::size_t shallowest) {
  STOWAGE_CHECK(shallowest <= cost.prefetch_depth, "the shallowest prefetch depth ", shallowest,
                " is above the cost model's ", cost.prefetch_depth);
  std::optional<DepthSolution> lowest;  // the attempt with the lowest peak so far
  for (std::size_t depth = cost.prefetch_depth + 1; depth-- > shallowest;) {
    CostModel at_depth = cost;
    at_depth.prefetch_depth = depth;
    Simulator simulator(trace, at_depth, budget);
    DepthSolution found{exact ? solve_exhaustive(simulator, budget) : solve_greedy(simulator, budget), depth};
    if (found.solution.fits) return found;
    if (!lowest || found.solution.simulation.peak_bytes < lowest->solution.simulation.peak_bytes) {
      lowest = std::move(found);
    }
  }
  return *lowest;
}

}  // namespace stowage::planner
