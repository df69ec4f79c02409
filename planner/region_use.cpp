#include "planner/region_use.hpp"

namespace stowage::planner {

RegionUse::RegionUse(const LifetimeTrace& trace, const Plan& plan)
    : recomputed_(trace.region_count()), offloaded_(trace.region_count()) {
  for (std::size_t t = 0; t < plan.size() && t < trace.tensors.size(); ++t) {
    change(trace.tensors[t], Decision::kKeep, plan[t]);
  }
}

bool RegionUse::allows(const SavedTensor& s, Decision d) const {
  if (s.region == kNoRegion) return true;
  const auto r = static_cast<std::size_t>(s.region);
  if (d == Decision::kRecompute) return offloaded_[r] == 0;
  if (d == Decision::kOffload) return recomputed_[r] == 0;
  return true;
}

void RegionUse::change(const SavedTensor& s, Decision from, Decision to) {
  if (s.region == kNoRegion || from == to) return;
  const auto r = static_cast<std::size_t>(s.region);
  if (from == Decision::kRecompute) --recomputed_[r];
  if (from == Decision::kOffload) --offloaded_[r];
  if (to == Decision::kRecompute) ++recomputed_[r];
  if (to == Decision::kOffload) ++offloaded_[r];
}

}  // namespace stowage::planner
