#include "offload/adam_buckets.hpp"

#include <algorithm>

#include "base/errors.hpp"

namespace stowage::offload {

std::vector<BucketPlan> plan_buckets(std::span<const PlannedParameter> params, std::int64_t bucket_numel) {
  STOWAGE_CHECK(bucket_numel >= 1, "bucket_numel must be positive, not ", bucket_numel);
  std::vector<BucketPlan> buckets;
  for (std::size_t i = params.size(); i-- > 0;) {
    const PlannedParameter& param = params[i];
    STOWAGE_CHECK(param.numel >= 0, "a parameter of ", param.numel, " elements");
    if (!buckets.empty()) {
      const BucketPlan& current = buckets.back();
      const PlannedParameter& first = params[current.members.front()];
      const bool same = first.group == param.group && first.device == param.device && first.dtype == param.dtype;
      if (!same || current.numel + param.numel > bucket_numel) buckets.emplace_back();
    } else {
      buckets.emplace_back();
    }
    BucketPlan& bucket = buckets.back();
    bucket.members.push_back(i);
    bucket.offsets.push_back(bucket.numel);
    bucket.numel += param.numel;
  }
  return buckets;
}

std::size_t kept_on_device(std::span<const std::int64_t> numels, double fraction) {
  STOWAGE_CHECK(fraction >= 0.0 && fraction <= 1.0, "device_fraction must lie in [0, 1], not ", fraction);
  double total = 0.0;
  for (const std::int64_t numel : numels) total += static_cast<double>(numel);
  const double budget = fraction * total;
  double taken = 0.0;
  std::size_t count = 0;
  for (const std::int64_t numel : numels) {
    if (taken + static_cast<double>(numel) > budget) break;
    taken += static_cast<double>(numel);
    ++count;
  }
  return count;
}

bool is_narrow(ElementType dtype, bool master_weights) noexcept {
  return dtype != ElementType::kFloat32 && !master_weights;
}

std::int64_t bytes_per_parameter(ElementType dtype, int grad_buffers, bool amsgrad, bool master_weights,
                                 int state_sets) noexcept {
  const auto element = static_cast<std::int64_t>(element_size(dtype));
  const std::int64_t states = (3 + (amsgrad ? 1 : 0)) * state_sets;
  if (is_narrow(dtype, master_weights)) return (states + grad_buffers) * element;
  return 4 * states + grad_buffers * element + (dtype == ElementType::kFloat32 ? 0 : element);
}

std::int64_t staged_bytes_per_parameter(ElementType dtype, bool amsgrad, bool master_weights) noexcept {
  const std::int64_t moments = 2 + (amsgrad ? 1 : 0);
  if (is_narrow(dtype, master_weights)) return moments * static_cast<std::int64_t>(element_size(dtype));
  return 4 * moments + (dtype == ElementType::kFloat32 ? 0 : 4);  // fp32 masters of a narrower parameter
}

std::int64_t staging_ring_bytes(ElementType dtype, std::int64_t bucket_numel, std::size_t buckets) noexcept {
  const auto slots = static_cast<std::int64_t>(std::min(kStagingSlots, buckets));
  return slots * 2 * static_cast<std::int64_t>(element_size(dtype)) * bucket_numel;
}

std::vector<UpdateRun> update_runs(std::span<const RunSlot> slots) {
  std::vector<UpdateRun> runs;
  for (const RunSlot& slot : slots) {
    if (!slot.has_gradient) continue;
    if (!runs.empty() && runs.back().end == slot.offset && runs.back().step == slot.step) {
      runs.back().end = slot.offset + slot.numel;
    } else {
      runs.push_back({slot.offset, slot.offset + slot.numel, slot.step});
    }
  }
  return runs;
}

}  // namespace stowage::offload
