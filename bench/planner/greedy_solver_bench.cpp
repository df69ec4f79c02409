// How long the greedy planner takes on transformer-shaped traces of 1k to 10k saved tensors
// (the planner issue asks for seconds at ~10k), at a budget of half the unconstrained peak.
#include <benchmark/benchmark.h>

#include <random>

#include "planner/greedy_solver.hpp"

namespace stowage::planner {
namespace {

// `layers` blocks of 10 saved tensors each (a block's norm, projections, attention and MLP
// outputs), each block one forward op per tensor and a mirrored backward; sizes and durations
// vary by role, remaking a tensor reads the one before it in its block.
LifetimeTrace transformer_trace(std::size_t layers) {
  constexpr std::size_t kPerBlock = 10;
  constexpr std::uint64_t kRoleBytes[kPerBlock] = {8, 8, 24, 8, 8, 16, 8, 44, 44, 8};
  constexpr double kRoleMs[kPerBlock] = {0.05, 0.4, 0.2, 0.6, 0.4, 0.05, 0.05, 1.2, 0.1, 1.2};
  std::mt19937 random(1);
  std::uniform_real_distribution<double> jitter(0.9, 1.1);
  const std::size_t n = layers * kPerBlock;
  LifetimeTrace trace;
  for (std::size_t i = 0; i < n; ++i) {
    trace.ops.push_back({"f", "block", Phase::kForward, kRoleMs[i % kPerBlock] * jitter(random), 4ull << 30});
  }
  for (std::size_t i = n; i-- > 0;) {
    trace.ops.push_back({"b", "block", Phase::kBackward, 2 * trace.ops[i].duration_ms, 4ull << 30});
  }
  for (std::size_t i = 0; i < n; ++i) {
    SavedTensor s;
    s.module = "block";
    s.bytes = kRoleBytes[i % kPerBlock] << 20;
    s.created = i;
    s.last_forward_use = std::min(n - 1, i + 1 + (i % 3));
    s.first_backward_use = 2 * n - 1 - s.last_forward_use;
    s.last_backward_use = 2 * n - 1 - i;
    s.recompute_ms = trace.ops[i].duration_ms;
    if (i % kPerBlock != 0) s.recompute_inputs = {i - 1};
    trace.tensors.push_back(s);
  }
  return trace;
}

void BM_GreedyPlanner(benchmark::State& state) {
  const LifetimeTrace trace = transformer_trace(static_cast<std::size_t>(state.range(0)) / 10);
  const CostModel cost{25e6, 25e6, 2};  // 25 GB/s each way
  Simulator simulator(trace, cost);
  const std::uint64_t peak = simulator.simulate(Plan(trace.tensors.size(), Decision::kKeep)).peak_bytes;
  const std::uint64_t budget = peak / 2;
  for (auto _ : state) {
    Solution solution = solve_greedy(simulator, budget);
    benchmark::DoNotOptimize(solution);
    state.counters["fits"] = solution.fits ? 1 : 0;
    state.counters["slowdown"] = solution.simulation.step_ms / trace.compute_ms();
  }
  state.counters["tensors"] = static_cast<double>(trace.tensors.size());
}
BENCHMARK(BM_GreedyPlanner)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace stowage::planner
BENCHMARK_MAIN();
