// A plan as `stowage plan` and a printed plan show it: the bytes each decision holds per group
// of modules (a model's repeated blocks folded into one), and the reference plans a plan is
// judged against with their simulated outcomes.
//
// Contract: functions of a trace and a plan checked against it (plan_problem); values out.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "planner/lifetime_trace.hpp"
#include "planner/plan.hpp"
#include "planner/simulator.hpp"

namespace stowage::planner {

// A module path's group: each index between dots folded to `*` and the leaf dropped
// (`blocks.3.mlp.fc1` -> `blocks.*.mlp`); a path of one part is its own group, "" is "(top)".
std::string module_group(std::string_view path);

struct ModuleBytes {
  std::string group;
  std::uint64_t keep = 0;
  std::uint64_t offload = 0;
  std::uint64_t recompute = 0;
};

// The saved bytes under each decision, per module group, in the order the trace first names each.
std::vector<ModuleBytes> bytes_by_module(const LifetimeTrace& trace, const Plan& plan);

struct ReferencePlan {
  std::string name;
  Plan decisions;
  Simulation simulation;  // under the trace's cost model, without a ceiling
};

// "no change" (everything kept), "full checkpointing" (every recomputable tensor recomputed:
// full activation checkpointing) and "offload everything" (every offloadable tensor offloaded).
std::vector<ReferencePlan> reference_plans(const LifetimeTrace& trace);

}  // namespace stowage::planner
