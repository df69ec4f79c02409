#include "planner/trace_builder.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "base/errors.hpp"
#include "planner/derived_quantities.hpp"

namespace stowage::planner {
namespace {

bool in_trace(const RecordedStorage& s, std::size_t op_count) {
  return s.producer.has_value() && s.first_backward.has_value() && *s.first_backward < op_count;
}

void check_recording(const StepRecording& recording) {
  const std::size_t count = recording.ops.size();
  for (std::size_t i = 0; i < recording.storages.size(); ++i) {
    const RecordedStorage& s = recording.storages[i];
    const bool inside = (!s.producer || *s.producer < count) && (!s.last_forward || *s.last_forward < count) &&
                        (!s.last_backward || *s.last_backward < count) &&
                        std::all_of(s.save_ops.begin(), s.save_ops.end(),
                                    [&](std::int64_t op) { return op < static_cast<std::int64_t>(count); });
    STOWAGE_CHECK(inside, "recorded storage ", i, " names an op beyond the step's ", count);
  }
  for (const TraceOp& op : recording.ops) {
    STOWAGE_CHECK(op.region < static_cast<std::int32_t>(recording.regions.size()), "op ", op.name, " ran in region ",
                  op.region, " of ", recording.regions.size());
  }
}

// Saved storages grouped by producing op, in the order of those ops (before regions are linked).
BuiltTrace group_by_producer(const StepRecording& recording) {
  const std::size_t count = recording.ops.size();
  std::map<std::size_t, std::size_t> tensor_of_op;  // ordered by op
  std::vector<SavedTensor> units;
  std::vector<std::vector<std::size_t>> storages;
  BuiltTrace built;
  for (std::size_t i = 0; i < recording.storages.size(); ++i) {
    const RecordedStorage& s = recording.storages[i];
    if (!in_trace(s, count)) {
      built.left_out.push_back(i);
      continue;
    }
    const std::size_t created = *s.producer;
    std::size_t last_forward = s.last_forward.value_or(created);
    for (const std::int64_t op : s.save_ops) {
      if (op >= 0) last_forward = std::max(last_forward, static_cast<std::size_t>(op));
    }
    const std::size_t first_backward = *s.first_backward;
    const std::size_t last_backward = std::max(s.last_backward.value_or(first_backward), first_backward);
    const std::int32_t region = recording.ops[created].region;
    auto [found, added] = tensor_of_op.emplace(created, units.size());
    if (added) {
      SavedTensor unit;
      unit.module = recording.ops[created].module;
      unit.created = created;
      unit.last_forward_use = last_forward;
      unit.first_backward_use = first_backward;
      unit.last_backward_use = last_backward;
      units.push_back(std::move(unit));
      storages.emplace_back();
    }
    SavedTensor& unit = units[found->second];
    unit.bytes += s.bytes;
    unit.last_forward_use = std::max(unit.last_forward_use, last_forward);
    unit.first_backward_use = std::min(unit.first_backward_use, first_backward);
    unit.last_backward_use = std::max(unit.last_backward_use, last_backward);
    storages[found->second].push_back(i);
    const std::set<std::int32_t> saved_in(s.save_regions.begin(), s.save_regions.end());
    if (region >= 0 && saved_in.count(region)) unit.region = region;
    unit.recomputable = unit.recomputable && region >= 0 && saved_in == std::set<std::int32_t>{region};
  }
  built.trace.ops = recording.ops;
  for (const auto& [op, t] : tensor_of_op) {
    built.trace.tensors.push_back(std::move(units[t]));
    built.storages_of_tensor.push_back(std::move(storages[t]));
  }
  return built;
}

// Which blocks can be checkpointed and what each receives; then each tensor's region and inputs.
void link_regions(const StepRecording& recording, BuiltTrace& built) {
  std::unordered_map<std::size_t, std::size_t> tensor_of_op;
  for (std::size_t t = 0; t < built.trace.tensors.size(); ++t) tensor_of_op[built.trace.tensors[t].created] = t;
  std::map<std::string, std::size_t> calls;
  for (const RecordedRegion& region : recording.regions) ++calls[region.module];
  const auto r_count = recording.regions.size();
  built.region_checkpointable.assign(r_count, false);
  built.region_inputs.assign(r_count, {});
  for (std::size_t r = 0; r < r_count; ++r) {
    const RecordedRegion& region = recording.regions[r];
    bool checkpointable = region.checkpointable;
    for (const std::int64_t input : region.inputs) {
      const bool known = input >= 0 && static_cast<std::size_t>(input) < recording.storages.size();
      const RecordedStorage* s = known ? &recording.storages[static_cast<std::size_t>(input)] : nullptr;
      const auto tensor = s && s->producer ? tensor_of_op.find(*s->producer) : tensor_of_op.end();
      if (tensor == tensor_of_op.end() || std::find(s->save_regions.begin(), s->save_regions.end(),
                                                    static_cast<std::int32_t>(r)) == s->save_regions.end()) {
        checkpointable = false;
        break;
      }
      built.region_inputs[r].push_back(tensor->second);
    }
    built.region_checkpointable[r] = checkpointable && calls[region.module] == 1;
  }
  for (SavedTensor& unit : built.trace.tensors) {
    if (unit.region < 0) continue;
    const auto r = static_cast<std::size_t>(unit.region);
    unit.recomputable = unit.recomputable && built.region_checkpointable[r];
    if (!built.region_checkpointable[r]) {
      unit.region = kNoRegion;  // never checkpointed: its saves reach the offloader
      continue;
    }
    std::set<std::size_t> inputs;
    for (const std::size_t i : built.region_inputs[r]) {
      if (built.trace.tensors[i].created < unit.created) inputs.insert(i);
    }
    unit.recompute_inputs.assign(inputs.begin(), inputs.end());
  }
}

// What the runtime finds tensors and regions by: packs, kept saves, the regions' ops and calls.
void attach_sites(const StepRecording& recording, BuiltTrace& built) {
  LifetimeTrace& trace = built.trace;
  for (std::size_t t = 0; t < trace.tensors.size(); ++t) {
    std::vector<SaveSite>& packs = trace.tensors[t].packs;
    for (const std::size_t s : built.storages_of_tensor[t]) {
      const auto& sites = recording.storages[s].sites;
      packs.insert(packs.end(), sites.begin(), sites.end());
    }
    std::sort(packs.begin(), packs.end());  // whatever the addresses' order
  }
  trace.kept_saves = recording.fixed_saves;
  for (const std::size_t s : built.left_out) {
    const auto& sites = recording.storages[s].sites;
    trace.kept_saves.insert(trace.kept_saves.end(), sites.begin(), sites.end());
  }
  for (std::size_t r = 0; r < recording.regions.size(); ++r) {
    const RecordedRegion& region = recording.regions[r];
    trace.regions.push_back({region.module, region.call, built.region_checkpointable[r], {},
                             built.region_inputs[r]});
  }
  for (TraceOp& op : trace.ops) {
    if (op.region < 0) continue;
    std::vector<std::string>& ops = trace.regions[static_cast<std::size_t>(op.region)].ops;
    op.region_op = static_cast<std::int32_t>(ops.size());
    ops.push_back(op.name);
  }
}

}  // namespace

BuiltTrace build_trace(const StepRecording& recording) {
  check_recording(recording);
  BuiltTrace built = group_by_producer(recording);
  derive_other_bytes(built.trace);
  derive_recompute_times(built.trace);  // over the regions as recorded, before link_regions drops some
  link_regions(recording, built);
  built.trace.validate();
  built.unconstrained_peak_bytes = planner::unconstrained_peak_bytes(built.trace);
  built.trace.unconstrained_peak_bytes = built.unconstrained_peak_bytes;
  attach_sites(recording, built);
  return built;
}

}  // namespace stowage::planner
