// What a solver returns: the plan, its simulation, and whether it fits the budget it was given.
#pragma once

#include <cstdint>

#include "planner/plan.hpp"
#include "planner/simulator.hpp"

namespace stowage::planner {

struct Solution {
  Plan plan;
  Simulation simulation;
  bool fits = false;  // simulation.peak_bytes <= the budget
};

// Whether `a` is a better outcome than `b` under `budget`: fitting beats not fitting; between two
// that fit, the shorter step (then the lower peak); between two that do not, the lower peak.
bool better_outcome(const Simulation& a, const Simulation& b, std::uint64_t budget);

}  // namespace stowage::planner
