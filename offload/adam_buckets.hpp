// The offloaded optimizer's layout, as numbers: which parameters keep their states on the device,
// how the offloaded ones are grouped in buckets, what a parameter costs in host memory, and the
// runs one bucket's update is made of. Nothing here knows about tensors or torch: the torch layer
// (python/tensors/host_bucket.hpp) lays out host memory by these plans.
//
// Note [Optimizer buckets]
// A bucket holds parameters of one param group, one device and one dtype, in the order their
// gradients usually become final (reverse registration order, as DDP's buckets), up to
// `bucket_numel` elements (a larger parameter gets a bucket of its own). Its gradients are copied
// into one staging buffer as they arrive; once all have, one update runs over the whole bucket in
// runs of consecutive parameters that have a gradient this step and share a step count (one kernel
// call each), and its parameters are written back from one buffer.
//
// Contract: pure functions; they throw LogicError on arguments no caller should give.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "offload/adamw_kernel.hpp"

namespace stowage::offload {

// One parameter as the planner sees it: its param group (a number the caller gives; parameters of
// one group share options), its dtype, its element count (this rank's shard under FSDP2) and its
// device (a number the caller gives).
struct PlannedParameter {
  std::size_t group = 0;
  ElementType dtype = ElementType::kFloat32;
  std::int64_t numel = 0;
  std::int64_t device = 0;
};

// One bucket: the parameters it holds (indices into the planner's input, in bucket order) and
// each one's first element in the bucket's buffers.
struct BucketPlan {
  std::vector<std::size_t> members;
  std::vector<std::int64_t> offsets;
  std::int64_t numel = 0;
};

// Note [Optimizer buckets]: the buckets for `params` (given in the optimizer's order).
[[nodiscard]] std::vector<BucketPlan> plan_buckets(std::span<const PlannedParameter> params,
                                                   std::int64_t bucket_numel);

// How many of the first parameters (in the optimizer's order) keep their states on the device for
// `fraction` of the parameters by count: the leading ones that fit in that share. A first
// parameter larger than the share keeps none there (the share is by whole parameters).
[[nodiscard]] std::size_t kept_on_device(std::span<const std::int64_t> numels, double fraction);

// Whether parameters of `dtype` keep their states in their own precision (what torch's Adam keeps
// for bf16 / fp16 parameters) rather than as fp32 masters and moments.
[[nodiscard]] bool is_narrow(ElementType dtype, bool master_weights) noexcept;

// Host bytes one offloaded parameter takes where its buffers persist (update="in_backward" and
// "delayed", whose gradients are copied out during backward): its master and moments (and
// amsgrad's maximum), `state_sets` times (two where updates are written out of place), the
// gradient buffers, and, with fp32 masters of a parameter that is not fp32, an output buffer
// (otherwise the masters are written back as they are).
[[nodiscard]] std::int64_t bytes_per_parameter(ElementType dtype, int grad_buffers, bool amsgrad,
                                               bool master_weights, int state_sets = 1) noexcept;

// Note [Staged buckets]
// update="exact" keeps on the host only what torch's optimizer keeps as state: the moments (and
// amsgrad's maximum), and with master_weights the fp32 masters. At step() each bucket's parameters
// and gradients, as they are on the device then, are copied into one slot of a ring of
// min(kStagingSlots, buckets) host buffers, updated there, and its parameters written back from
// there; a slot is taken again only once its last write-back has finished, so one bucket is copied
// out while the one before is updated and the one before that is written back (the first copy
// out and the last write-back alone are exposed). The ring's bytes follow the largest bucket, not
// the count: host memory is the states' bytes a parameter plus a bounded staging.
inline constexpr std::size_t kStagingSlots = 3;

// Host bytes one offloaded parameter takes with staged buckets: its states alone.
[[nodiscard]] std::int64_t staged_bytes_per_parameter(ElementType dtype, bool amsgrad, bool master_weights) noexcept;

// Host bytes of the staging ring for `buckets` buckets of at most `bucket_numel` elements of
// `dtype`: each of its min(kStagingSlots, buckets) slots holds one bucket's parameters and gradients.
[[nodiscard]] std::int64_t staging_ring_bytes(ElementType dtype, std::int64_t bucket_numel,
                                              std::size_t buckets) noexcept;

// One parameter of a bucket at update time: where it lies, its step count before this update,
// and whether it has a gradient this step.
struct RunSlot {
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  std::int64_t step = 0;
  bool has_gradient = false;
};

// One kernel call: elements [begin, end) at step `step`.
struct UpdateRun {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t step = 0;
  bool operator==(const UpdateRun&) const = default;
};

// The runs of consecutive slots with a gradient and the same step count (Note [Optimizer
// buckets]); `step` of each run is the count the slots hold.
[[nodiscard]] std::vector<UpdateRun> update_runs(std::span<const RunSlot> slots);

}  // namespace stowage::offload
