// The planner's fast heuristic (Note [Greedy planning]).
//
// Note [Greedy planning]
// Start with every tensor kept. While the simulated peak is over the budget, look at the op at
// the peak: each kept tensor live there that a decision would free there is a candidate, at an
// estimated cost per byte (recompute: its producer's time; offload: the part of its reload that
// the compute before its use cannot hide, on an idle link, its reload expected to start when the
// buffer `prefetch_depth` ahead of it is used), and the cheapest candidates are taken until they
// cover the excess; then simulate again (the simulator, not the estimate, decides whether the
// peak moved). Where no candidate frees the peak op by itself, offload the live tensor needed
// soonest: the buffers backward brings back first then no longer include those needed later. A
// region may not both recompute and offload, so an early pick can shut a way out: five starts
// (cheaper per byte; leaning to each way; each way alone). Then refine: try each decision back as
// keep or as the other choice, and each region's decisions all switched, taking a change whenever
// the simulation says the step is shorter while still fitting (or, not fitting yet, the peak
// lower), for a few passes; each start is refined on traces of up to 2000 saved tensors, only
// the best start beyond. Each round is one simulation, O(ops + tensors).
//
// Contract: uses the simulator's buffers (one thread).
#pragma once

#include <cstdint>

#include "planner/simulator.hpp"
#include "planner/solution.hpp"

namespace stowage::planner {

Solution solve_greedy(Simulator& simulator, std::uint64_t budget);

}  // namespace stowage::planner
