// Where the steps a plan is applied to depart from its trace, and what the user hears of it: one
// warning the first time the steps depart in a given way, not one a step (README, "Planning keep
// / offload / recompute").
//
// Contract: not thread-safe; one per plan, used on the thread running its steps. `this_step`
// holds the current (or last) step's departures, each once.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace stowage::planner {

class StepDepartures {
 public:
  static constexpr std::size_t kShown = 3;  // departures named in a warning; the rest are counted

  void begin_step() { this_step_.clear(); }
  void note(const std::string& what);
  // Counts a step that ran to its end; the warning to give where it departs in a way no earlier
  // step did.
  std::optional<std::string> end_step();

  const std::vector<std::string>& this_step() const noexcept { return this_step_; }
  std::int64_t steps() const noexcept { return steps_; }                    // steps run to their end
  std::int64_t departed_steps() const noexcept { return departed_steps_; }  // of those, with a departure

 private:
  std::vector<std::string> this_step_;
  std::set<std::string> seen_;
  std::int64_t steps_ = 0;
  std::int64_t departed_steps_ = 0;
};

}  // namespace stowage::planner
