// One micro-batch's lifetime trace by its rows, as stowage.fit weighs micro-batch sizes: a step
// recorded once (the same trace at any rows: a batch fit does not cut) or at a grid of sizes
// (evaluated with the rows in one size and the others fixed, Note [Sized traces]), with the cost
// model the step was measured under, and the checkpoint regions left out of recomputation (a
// block whose forward runs other ops when recomputed: stowage.fitting.choosing).
//
// Note [Calibrated compute]
// The recorder times each op alone: synchronized, between its own bookkeeping, the first run of
// the step (first touches of its memory). The step run whole is not that sum: on a GPU launches
// overlap kernels, on a CPU the worker threads sleep between recorded ops and are woken for each
// (on a busy host the wake-up waits for a core). fit times the step run plainly once recorded and
// scales every op's time, and every tensor's time to recompute, so that the recorded step's ops
// take what the plain step took (`with_compute_scale`): a plan's step is then predicted in the
// step's own time, and recomputing an op costs its share of it.
//
// Contract: a value; immutable once built; `at` is const and safe to call from several threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "planner/cost_model.hpp"
#include "planner/lifetime_trace.hpp"
#include "planner/sized_trace.hpp"

namespace stowage::planner {

class StepTraces {
 public:
  // The step recorded once: `trace` at any rows.
  StepTraces(LifetimeTrace trace, CostModel cost);
  // The step recorded at a grid: `sized` at `values` (one per size) with `rows_size`'s replaced by the rows.
  StepTraces(SizedTrace sized, std::vector<std::int64_t> values, std::size_t rows_size, CostModel cost);

  // The same traces with `regions` not checkpointable and their saved tensors not recomputable
  // (kept or offloaded).
  StepTraces without_recompute(const std::set<std::int32_t>& regions) const;

  // The same traces with every op's and recompute's time times `scale` (Note [Calibrated compute]);
  // throws LogicError unless it is positive and finite.
  StepTraces with_compute_scale(double scale) const;
  double compute_scale() const noexcept { return compute_scale_; }

  // The trace of a micro-batch of `rows` rows (the recorded one where the step was recorded once).
  LifetimeTrace at(std::int64_t rows) const;
  const CostModel& cost() const noexcept { return cost_; }

 private:
  std::optional<LifetimeTrace> whole_;
  std::optional<SizedTrace> sized_;
  std::vector<std::int64_t> values_;
  std::size_t rows_size_ = 0;
  CostModel cost_;
  std::set<std::int32_t> not_recomputed_;
  double compute_scale_ = 1.0;
};

}  // namespace stowage::planner
