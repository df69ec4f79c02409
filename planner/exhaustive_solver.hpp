// The exact planner for small graphs: every assignment of keep / offload / recompute, pruned by a
// lower bound on the step (the ops' time plus the recomputation chosen so far; copies only add),
// simulated at the leaves. Among the plans that fit, the shortest step (then the lowest peak);
// when none fits, the lowest peak. Tests measure the greedy solver's gap with it.
//
// Contract: at most kMaxExhaustiveTensors saved tensors (3^16 plans); uses the simulator's
// buffers (one thread).
#pragma once

#include <cstddef>
#include <cstdint>

#include "planner/simulator.hpp"
#include "planner/solution.hpp"

namespace stowage::planner {

inline constexpr std::size_t kMaxExhaustiveTensors = 16;

Solution solve_exhaustive(Simulator& simulator, std::uint64_t budget);

}  // namespace stowage::planner
