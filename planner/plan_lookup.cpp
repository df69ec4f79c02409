#include "planner/plan_lookup.hpp"

#include <algorithm>

namespace stowage::planner {
namespace {

void count_call(std::map<std::string, std::int64_t>& calls, const std::string& path, std::int64_t call) {
  std::int64_t& count = calls[path];
  count = std::max(count, call + 1);
}

}  // namespace

PlanLookup plan_lookup(const LifetimeTrace& trace, const Plan& plan) {
  PlanLookup lookup;
  lookup.kept_saves.insert(trace.kept_saves.begin(), trace.kept_saves.end());
  std::set<std::int32_t> recomputed;
  for (std::size_t t = 0; t < trace.tensors.size(); ++t) {
    for (const SaveSite& site : trace.tensors[t].packs) lookup.unit_of_save.insert_or_assign(site, t);
    if (plan[t] == Decision::kRecompute) recomputed.insert(trace.tensors[t].region);
    if (plan[t] == Decision::kOffload) lookup.offloaded.insert(t);
  }
  for (const std::int32_t r : recomputed) {
    const TraceRegion& region = trace.regions[static_cast<std::size_t>(r)];
    CheckpointedCall& call = lookup.checkpointed[{region.module, region.call}];
    call.first = r;
    for (std::size_t t = 0; t < trace.tensors.size(); ++t) {
      const SavedTensor& tensor = trace.tensors[t];
      if (tensor.region == r && plan[t] != Decision::kRecompute) call.second.insert(trace.ops[tensor.created].region_op);
    }
    lookup.checkpointed_modules.push_back(region.module);
  }
  std::sort(lookup.checkpointed_modules.begin(), lookup.checkpointed_modules.end());
  lookup.checkpointed_modules.erase(
      std::unique(lookup.checkpointed_modules.begin(), lookup.checkpointed_modules.end()),
      lookup.checkpointed_modules.end());
  for (const auto& [site, unit] : lookup.unit_of_save) count_call(lookup.recorded_calls, std::get<0>(site), std::get<1>(site));
  for (const SaveSite& site : lookup.kept_saves) count_call(lookup.recorded_calls, std::get<0>(site), std::get<1>(site));
  for (const TraceRegion& region : trace.regions) count_call(lookup.recorded_calls, region.module, region.call);
  return lookup;
}

}  // namespace stowage::planner
