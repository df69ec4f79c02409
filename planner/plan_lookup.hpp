// What applying a plan to a step looks up as the step runs (stowage.plan's Plan): the saved
// tensor each save site is, the sites no decision moves, the region calls the plan checkpoints
// with the ops each keeps, and how many calls each module had in the recorded step (a module
// called more often under the plan numbers its later calls as the recorded ones again).
//
// Contract: a value, built once from a trace and a plan checked against it (plan_problem).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "planner/lifetime_trace.hpp"
#include "planner/plan.hpp"

namespace stowage::planner {

// A module call, as a region and a module frame name it: (module path, its call number).
using ModuleCall = std::pair<std::string, std::int64_t>;

// A checkpointed call: its region, and the places among the region's ops of the ops whose
// outputs the plan keeps (the rest are recomputed in backward).
using CheckpointedCall = std::pair<std::int32_t, std::set<std::int32_t>>;

struct PlanLookup {
  std::map<SaveSite, std::size_t> unit_of_save;  // a save site -> its saved tensor
  std::set<SaveSite> kept_saves;
  std::set<std::size_t> offloaded;  // the saved tensors the plan offloads
  std::map<ModuleCall, CheckpointedCall> checkpointed;  // the calls of the regions the plan recomputes in
  std::vector<std::string> checkpointed_modules;        // their module paths, sorted, each once
  std::map<std::string, std::int64_t> recorded_calls;   // module path -> its calls in the recorded step
};

PlanLookup plan_lookup(const LifetimeTrace& trace, const Plan& plan);

}  // namespace stowage::planner
