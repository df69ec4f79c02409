#include "planner/step_ledger.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

#include "base/errors.hpp"

namespace stowage::planner {

void StepLedger::op_ran(Phase phase, const Keys& used, const Keys& made_keys) {
  const std::size_t index = ops_++;
  for (const Key key : used) {
    if (phase == Phase::kForward) {
      last_forward_[key] = index;
    } else if (const auto found = saved_.find(key); found != saved_.end()) {
      storages_[found->second].recorded.last_backward = index;
    }
  }
  for (const Key key : made_keys) made(key, index, phase);
}

void StepLedger::made_outside_ops(Phase phase, const Keys& made_keys) {
  for (const Key key : made_keys) made(key, std::nullopt, phase);
}

void StepLedger::made(Key key, std::optional<std::size_t> index, Phase phase) {
  if (key == 0) return;
  if (phase != Phase::kForward) {
    if (saved_.contains(key)) move_out(key);  // the saved storage was freed; this one took its address
  } else if (saved_.contains(key)) {
    return;
  } else if (index) {
    producer_[key] = *index;
    last_forward_[key] = *index;
  } else {  // no op of the step's made it: nothing that lived at the address before is its
    producer_.erase(key);
    last_forward_.erase(key);
  }
}

void StepLedger::move_out(Key key) {
  const Key own = --moved_;
  const std::size_t storage = saved_.at(key);
  saved_.erase(key);
  saved_.emplace(own, storage);
  storages_[storage].key = own;
  storages_[storage].order = next_order_++;
  for (auto* table : {&producer_, &last_forward_}) {
    if (const auto found = table->find(key); found != table->end()) {
      const std::size_t value = found->second;
      table->erase(found);
      (*table)[own] = value;
    }
  }
  for (std::vector<Key>& inputs : region_inputs_) std::replace(inputs.begin(), inputs.end(), key, own);
}

std::int32_t StepLedger::enter_region(const Keys& inputs) {
  std::vector<Key>& kept = region_inputs_.emplace_back();
  for (const Key key : inputs) {
    if (key != 0 && !fixed_.contains(key)) kept.push_back(key);
  }
  return static_cast<std::int32_t>(region_inputs_.size() - 1);
}

bool StepLedger::writes_input(std::int32_t region, const Keys& written) const {
  STOWAGE_CHECK(region >= 0 && static_cast<std::size_t>(region) < region_inputs_.size(), "region ", region,
                " was never entered (", region_inputs_.size(), " were)");
  const std::vector<Key>& inputs = region_inputs_[static_cast<std::size_t>(region)];
  return std::any_of(written.begin(), written.end(),
                     [&](Key key) { return std::find(inputs.begin(), inputs.end(), key) != inputs.end(); });
}

std::optional<std::size_t> StepLedger::save(Key key, std::uint64_t bytes, std::int32_t region,
                                            const SaveSite& site) {
  if (key == 0 || fixed_.contains(key)) {
    if (std::get<1>(site) >= 0) fixed_saves_.push_back(site);
    return std::nullopt;
  }
  auto [found, inserted] = saved_.try_emplace(key, storages_.size());
  if (inserted) {
    Storage& fresh = storages_.emplace_back();
    fresh.key = key;
    fresh.order = next_order_++;
    fresh.recorded.bytes = bytes;
  }
  RecordedStorage& recorded = storages_[found->second].recorded;
  recorded.save_ops.push_back(static_cast<std::int64_t>(ops_) - 1);
  recorded.sites.push_back(site);
  auto& regions = recorded.save_regions;
  if (const auto at = std::lower_bound(regions.begin(), regions.end(), region); at == regions.end() || *at != region) {
    regions.insert(at, region);
  }
  return found->second;
}

void StepLedger::taken_back(std::size_t storage) {
  STOWAGE_CHECK(storage < storages_.size(), "saved storage ", storage, " is not in the ledger (",
                storages_.size(), " are)");
  auto& first = storages_[storage].recorded.first_backward;
  if (!first) first = ops_;
}

std::vector<std::size_t> StepLedger::storage_order() const {
  std::vector<std::size_t> order(storages_.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return storages_[a].order < storages_[b].order; });
  return order;
}

StepRecording StepLedger::recording(std::vector<TraceOp> ops, std::vector<RecordedRegion> regions) const {
  STOWAGE_CHECK(ops.size() == ops_, ops.size(), " ops given for a ledger of ", ops_);
  STOWAGE_CHECK(regions.size() == region_inputs_.size(), regions.size(), " regions given for a ledger of ",
                region_inputs_.size());
  StepRecording recording;
  recording.ops = std::move(ops);
  const std::vector<std::size_t> order = storage_order();
  std::unordered_map<Key, std::int64_t> position;  // a saved storage's key -> its place in the recording
  for (const std::size_t storage : order) {
    const Storage& kept = storages_[storage];
    RecordedStorage recorded = kept.recorded;
    if (const auto found = producer_.find(kept.key); found != producer_.end()) recorded.producer = found->second;
    if (const auto found = last_forward_.find(kept.key); found != last_forward_.end()) {
      recorded.last_forward = found->second;
    }
    // A last backward use at op 0 is none (no backward op is the step's first).
    if (recorded.last_backward == std::size_t{0}) recorded.last_backward.reset();
    position.emplace(kept.key, static_cast<std::int64_t>(recording.storages.size()));
    recording.storages.push_back(std::move(recorded));
  }
  for (std::size_t r = 0; r < regions.size(); ++r) {
    regions[r].inputs.clear();
    for (const Key key : region_inputs_[r]) {
      const auto found = position.find(key);
      regions[r].inputs.push_back(found == position.end() ? -1 : found->second);
    }
  }
  recording.regions = std::move(regions);
  recording.fixed_saves = fixed_saves_;
  return recording;
}

}  // namespace stowage::planner
