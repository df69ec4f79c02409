// Solving under a budget across prefetch depths (Note [Prefetch depth]).
//
// Note [Prefetch depth]
// A buffer brought back ahead of its use holds its memory from where it is asked for until its use,
// and the ops between may need more than was free when it came: under a tight budget a plan
// overshoots where each buffer coming back at its use would not. So the search solves at the cost
// model's depth, then, while no plan fits, at each shallower one down to `shallowest`; the first
// that fits wins and carries its depth to the offloader. When none fits at any depth, the one with
// the lowest peak (the deepest among equals).
//
// Contract: a free function; the trace and cost model are the caller's and only read.
#pragma once

#include <cstddef>
#include <cstdint>

#include "planner/cost_model.hpp"
#include "planner/lifetime_trace.hpp"
#include "planner/solution.hpp"

namespace stowage::planner {

struct DepthSolution {
  Solution solution;
  std::size_t prefetch_depth = 0;  // the depth the plan was solved at
};

// `exact`: the exhaustive solver (up to kMaxExhaustiveTensors saved tensors) instead of the greedy.
// A plan's step runs with its allocated ceiling at its budget, and is simulated so.
DepthSolution solve_over_depths(const LifetimeTrace& trace, const CostModel& cost, std::uint64_t budget, bool exact,
                                std::size_t shallowest);

}  // namespace stowage::planner
