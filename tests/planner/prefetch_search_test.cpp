// The search over prefetch depths against the greedy solver run at each depth by hand: the
// deepest depth whose plan fits wins; when none does, the lowest peak.
#include "planner/prefetch_search.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>

#include "base/errors.hpp"
#include "planner/greedy_solver.hpp"
#include "tests/planner/mirrored_step.hpp"

namespace stowage::planner {
namespace {

// `n` forward ops each making one offloadable tensor used again in the mirrored backward op,
// sizes and durations drawn at random; nothing is recomputable, so only offload (and how many
// buffers come back ahead) moves the peak.
LifetimeTrace offload_only(std::mt19937& random, std::size_t n) {
  std::uniform_int_distribution<std::uint64_t> bytes(1, 8);
  std::uniform_real_distribution<double> ms(0.1, 1.0);
  return mirrored_step(n, [&] { return ms(random); }, 4, [&] { return bytes(random) << 10; });
}

TEST(PlannerPrefetchSearch, TakesTheDeepestDepthThatFitsElseTheLowestPeak) {
  std::mt19937 random(7);
  for (int round = 0; round < 60; ++round) {
    const LifetimeTrace trace = offload_only(random, 12);
    const CostModel cost{2000.0, 2000.0, 4};
    Simulator keep_all(trace, cost);
    const std::uint64_t peak = keep_all.simulate(Plan(trace.tensors.size(), Decision::kKeep)).peak_bytes;
    const std::uint64_t budget = peak * static_cast<std::uint64_t>(10 + round % 30) / 100;
    const DepthSolution found = solve_over_depths(trace, cost, budget, false, 0);
    std::optional<std::size_t> deepest_fitting;
    std::uint64_t lowest = UINT64_MAX;
    for (std::size_t depth = cost.prefetch_depth + 1; depth-- > 0;) {
      CostModel at_depth = cost;
      at_depth.prefetch_depth = depth;
      Simulator simulator(trace, at_depth, budget);
      const Solution solution = solve_greedy(simulator, budget);
      if (solution.fits && !deepest_fitting) deepest_fitting = depth;
      lowest = std::min(lowest, solution.simulation.peak_bytes);
    }
    if (deepest_fitting) {
      ASSERT_TRUE(found.solution.fits);
      EXPECT_EQ(found.prefetch_depth, *deepest_fitting);
    } else {
      ASSERT_FALSE(found.solution.fits);
      EXPECT_EQ(found.solution.simulation.peak_bytes, lowest);
    }
  }
}

TEST(PlannerPrefetchSearch, AGivenDepthIsTheOnlyOneTried) {
  std::mt19937 random(3);
  const LifetimeTrace trace = offload_only(random, 8);
  const CostModel cost{2000.0, 2000.0, 3};
  EXPECT_EQ(solve_over_depths(trace, cost, 1, false, 3).prefetch_depth, 3u);
  EXPECT_THROW(solve_over_depths(trace, cost, 1, false, 4), LogicError);
}

}  // namespace
}  // namespace stowage::planner
