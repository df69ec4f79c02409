#include "planner/region_policy.hpp"

#include <utility>

namespace stowage::planner {

RegionPolicy::RegionPolicy(std::vector<std::string> recorded_ops, std::set<std::int32_t> kept,
                           StepDepartures& departures, std::string where)
    : recorded_(std::move(recorded_ops)), kept_(std::move(kept)), departures_(departures), where_(std::move(where)) {}

bool RegionPolicy::keep(std::string_view op) {
  const std::size_t index = seen_++;
  if (matching_ && (index >= recorded_.size() || op != recorded_[index])) {
    matching_ = false;
    const std::string recorded = index < recorded_.size() ? recorded_[index] : "nothing";
    departures_.note(where_ + ": op " + std::to_string(index) + " is " + std::string(op) + ", recorded " + recorded);
  }
  return !matching_ || kept_.contains(static_cast<std::int32_t>(index));
}

}  // namespace stowage::planner
