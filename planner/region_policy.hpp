// The forward decisions of one checkpointed block call (Note [Selective recompute] in
// python/stowage/plan/recompute_modes.py): per op, in the order the lifetime trace recorded the
// block's ops, keep (cache) the outputs of the ops the plan keeps and recompute the rest. An op
// that is not the one recorded at its place means the plan does not match the step: from there on
// everything is kept (the block then frees nothing more, but computes the same), and the mismatch
// is noted among the step's departures.
//
// Contract: one per checkpoint call (torch calls its context_fn per call), on the thread running
// the step; `departures` outlives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "planner/step_departures.hpp"

namespace stowage::planner {

class RegionPolicy {
 public:
  // `recorded_ops`: the region's ops' names as recorded; `kept`: the places of the ops whose
  // outputs the plan keeps; `where`: the block's module path, naming it in a departure.
  RegionPolicy(std::vector<std::string> recorded_ops, std::set<std::int32_t> kept, StepDepartures& departures,
               std::string where);

  // Whether the forward's next op, named `op`, keeps its outputs (else it is recomputed).
  bool keep(std::string_view op);

 private:
  std::vector<std::string> recorded_;
  std::set<std::int32_t> kept_;
  StepDepartures& departures_;
  std::string where_;
  std::size_t seen_ = 0;
  bool matching_ = true;
};

}  // namespace stowage::planner
