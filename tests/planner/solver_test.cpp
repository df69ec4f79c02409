// The greedy planner against the exhaustive one on seeded random graphs (chains of layers with
// skip uses, random sizes, durations, links and budgets), and both on the rules every plan keeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "base/errors.hpp"
#include "base/sanitizers.hpp"
#include "planner/exhaustive_solver.hpp"
#include "planner/greedy_solver.hpp"

namespace stowage::planner {
namespace {

// n forward ops, op i making saved tensor i, read by the next 1 to 3 ops; backward mirrors
// forward (op 2n-1-i is op i's backward), so tensor i is needed from the backward of its last
// forward reader to the backward of its producer. Remaking tensor i reads tensor i-1. With
// `regions`, runs of 1 to 4 tensors form checkpoint regions (the first of a run is outside).
LifetimeTrace random_graph(std::mt19937& random, std::size_t n, bool regions = false) {
  std::uniform_real_distribution<double> duration(0.5, 5.0), chance(0.0, 1.0);
  std::uniform_int_distribution<std::uint64_t> size(1, 100);
  std::uniform_int_distribution<std::size_t> reach(1, 3);
  LifetimeTrace trace;
  std::vector<double> forward_ms(n);
  for (std::size_t i = 0; i < n; ++i) forward_ms[i] = duration(random);
  const std::uint64_t other = size(random) * 10;
  for (std::size_t i = 0; i < n; ++i) trace.ops.push_back({"f", "layer", Phase::kForward, forward_ms[i], other});
  for (std::size_t i = n; i-- > 0;) {
    trace.ops.push_back({"b", "layer", Phase::kBackward, 2 * forward_ms[i], other + size(random)});
  }
  for (std::size_t i = 0; i < n; ++i) {
    SavedTensor s;
    s.module = "layer";
    s.bytes = size(random) << 20;
    s.created = i;
    s.last_forward_use = std::min(n - 1, i + reach(random));
    s.first_backward_use = 2 * n - 1 - s.last_forward_use;
    s.last_backward_use = 2 * n - 1 - i;
    s.recompute_ms = forward_ms[i];
    s.recomputable = chance(random) < 0.9;
    s.offloadable = chance(random) < 0.9;
    if (i > 0) s.recompute_inputs = {i - 1};
    trace.tensors.push_back(s);
  }
  if (regions) {
    std::uniform_int_distribution<std::size_t> run(1, 4);
    std::int32_t region = 0;
    for (std::size_t i = 0; i < n;) {
      trace.tensors[i].recomputable = false;  // the region's input: made outside it
      const std::size_t end = std::min(n, i + 1 + run(random));
      for (std::size_t j = i + 1; j < end; ++j) trace.tensors[j].region = region;
      ++region;
      i = end;
    }
  }
  return trace;
}

CostModel random_link(std::mt19937& random) {
  // A 50 MiB tensor's copy takes 0.2 to 5 ms: from well hidden to not hidden at all.
  std::uniform_real_distribution<double> copy_ms(0.2, 5.0);
  const double bytes_per_ms = static_cast<double>(50u << 20) / copy_ms(random);
  return {bytes_per_ms, bytes_per_ms, 2};
}

// The exhaustive search tries 3^n plans; a sanitizer build runs it some 80 times slower, so it
// compares on graphs of up to 9 tensors (the full range runs in every other build).
#if defined(STOWAGE_ADDRESS_SANITIZER) || defined(STOWAGE_THREAD_SANITIZER)
constexpr std::size_t kMostTensors = 9;
#else
constexpr std::size_t kMostTensors = 12;
#endif

// Greedy against exhaustive on 200 seeded graphs; returns the 95th-percentile gap in step time.
double greedy_gap_p95(bool regions) {
  std::mt19937 random(20261124);
  std::uniform_int_distribution<std::size_t> tensors(2, kMostTensors);
  std::uniform_real_distribution<double> squeeze(0.0, 0.95);
  std::vector<double> gaps;
  int exact_fits = 0, greedy_fits = 0;
  for (int graph = 0; graph < 200; ++graph) {
    const LifetimeTrace trace = random_graph(random, tensors(random), regions);
    const CostModel cost = random_link(random);
    Simulator simulator(trace, cost);
    const std::uint64_t unconstrained = simulator.simulate(Plan(trace.tensors.size(), Decision::kKeep)).peak_bytes;
    // Between the lowest peak any plan reaches and the peak with everything kept.
    const std::uint64_t lowest = solve_exhaustive(simulator, 0).simulation.peak_bytes;
    const auto budget = lowest + static_cast<std::uint64_t>(static_cast<double>(unconstrained - lowest) * squeeze(random));
    const Solution exact = solve_exhaustive(simulator, budget);
    const Solution greedy = solve_greedy(simulator, budget);
    EXPECT_EQ(greedy.simulation.peak_bytes, simulator.simulate(greedy.plan).peak_bytes);  // and keeps the rules
    if (greedy.fits) {
      EXPECT_LE(greedy.simulation.peak_bytes, budget);
      EXPECT_TRUE(exact.fits) << "graph " << graph << ": greedy fits where the exhaustive search does not";
      EXPECT_GE(greedy.simulation.step_ms, exact.simulation.step_ms - 1e-9) << "graph " << graph;
    }
    if (!exact.fits) continue;
    ++exact_fits;
    greedy_fits += greedy.fits ? 1 : 0;
    gaps.push_back(greedy.fits ? greedy.simulation.step_ms / exact.simulation.step_ms - 1 : INFINITY);
  }
  EXPECT_EQ(exact_fits, 200) << "every budget is at or above the lowest peak a plan reaches";
  std::sort(gaps.begin(), gaps.end());
  const double p95 = gaps[static_cast<std::size_t>(0.95 * static_cast<double>(gaps.size() - 1))];
  const double median = gaps[gaps.size() / 2];
  std::printf("%s: graphs with a fitting plan: %d, greedy found one for %d; gap median %.4f, p95 %.4f, max %.4f\n",
              regions ? "with checkpoint regions" : "per tensor", exact_fits, greedy_fits, median, p95,
              gaps.back());
  return p95;
}

TEST(PlannerSolvers, GreedyIsWithinFivePercentOfExhaustiveAtThe95thPercentile) {
  EXPECT_LE(greedy_gap_p95(false), 0.05);
}

TEST(PlannerSolvers, WithCheckpointRegionsGreedyIsWithinFivePercentOfExhaustive) {
  EXPECT_LE(greedy_gap_p95(true), 0.05);
}

TEST(PlannerSolvers, NoBudgetPressureKeepsEverything) {
  std::mt19937 random(7);
  const LifetimeTrace trace = random_graph(random, 8);
  const CostModel cost = random_link(random);
  Simulator simulator(trace, cost);
  const Solution greedy = solve_greedy(simulator, UINT64_MAX);
  EXPECT_TRUE(greedy.fits);
  EXPECT_TRUE(std::all_of(greedy.plan.begin(), greedy.plan.end(), [](Decision d) { return d == Decision::kKeep; }));
  EXPECT_DOUBLE_EQ(greedy.simulation.step_ms, trace.compute_ms());
}

TEST(PlannerSolvers, ABudgetBelowEveryPlanReturnsTheLowestPeakAndSaysItDoesNotFit) {
  std::mt19937 random(11);
  const LifetimeTrace trace = random_graph(random, 6);
  const CostModel cost = random_link(random);
  Simulator simulator(trace, cost);
  const Solution exact = solve_exhaustive(simulator, 1);
  const Solution greedy = solve_greedy(simulator, 1);
  EXPECT_FALSE(exact.fits);
  EXPECT_FALSE(greedy.fits);
  EXPECT_LE(exact.simulation.peak_bytes, greedy.simulation.peak_bytes);
  const std::uint64_t kept = simulator.simulate(Plan(trace.tensors.size(), Decision::kKeep)).peak_bytes;
  EXPECT_LT(greedy.simulation.peak_bytes, kept);
}

TEST(PlannerSolvers, TheExhaustiveSearchRefusesGraphsTooLargeForIt) {
  std::mt19937 random(3);
  const LifetimeTrace trace = random_graph(random, kMaxExhaustiveTensors + 1);
  const CostModel cost = random_link(random);
  Simulator simulator(trace, cost);
  EXPECT_THROW(solve_exhaustive(simulator, 1), LogicError);
}

}  // namespace
}  // namespace stowage::planner
