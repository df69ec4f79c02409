// The planner's fast heuristic (Note [Greedy planning]).
//
// Note [Greedy planning]
// Start with every tensor kept. While the simulated peak is over the budget, look at the op at
// the peak: each kept tensor live there that a decision would free there is a candidate, at an
// estimated cost per byte (recompute: its producer's time; offload: the part of its page-in that
// the compute before its use cannot hide, on an idle link), and the cheapest candidates are taken
// until they cover the excess; then simulate again (the simulator, not the estimate, decides
// whether the peak moved). Once the plan fits (or no candidate is left), refine it: try each
// decision back as keep or as the other choice, and take a change whenever the simulation says
// the step is shorter while still fitting (or, not fitting yet, the peak lower), for a few
// passes. Each round is one simulation, O(ops + tensors), so a 10k-tensor step plans in seconds.
//
// Contract: uses the simulator's buffers (one thread).
#pragma once

#include <cstdint>

#include "planner/simulator.hpp"
#include "planner/solution.hpp"

namespace stowage::planner {

Solution solve_greedy(Simulator& simulator, std::uint64_t budget);

}  // namespace stowage::planner
