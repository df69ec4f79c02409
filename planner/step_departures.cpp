#include "planner/step_departures.hpp"

#include <algorithm>

namespace stowage::planner {

void StepDepartures::note(const std::string& what) {
  if (std::find(this_step_.begin(), this_step_.end(), what) == this_step_.end()) this_step_.push_back(what);
}

std::optional<std::string> StepDepartures::end_step() {
  ++steps_;
  if (this_step_.empty()) return std::nullopt;
  ++departed_steps_;
  std::vector<std::string> fresh;
  for (const std::string& what : this_step_) {
    if (seen_.insert(what).second) fresh.push_back(what);
  }
  if (fresh.empty()) return std::nullopt;
  std::string named;
  for (std::size_t i = 0; i < std::min(fresh.size(), kShown); ++i) named.append(i > 0 ? "; " : "").append(fresh[i]);
  if (fresh.size() > kShown) named.append("; and ").append(std::to_string(fresh.size() - kShown)).append(" more");
  return "stowage.plan: step " + std::to_string(steps_) + " does not match the lifetime trace the plan was made from (" +
         named +
         "). What the plan cannot place is offloaded: the numbers are the same and the budget holds, at the cost of "
         "copies the plan did not weigh. Profile the step as it runs now (stowage.plan.profile, or stowage.fit "
         "again) for a plan that places it. Said once for these; plan.departed_steps counts the steps that depart (" +
         std::to_string(departed_steps_) + " of " + std::to_string(steps_) + " so far).";
}

}  // namespace stowage::planner
