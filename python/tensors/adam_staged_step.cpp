// AdamSlots' step() with update="exact": buckets staged through the ring at step() (Note [Staged
// buckets] in offload/adam_buckets.hpp). The gradient used is the one present at step() and the
// parameter updated is the one present at step(), whoever wrote them: both are copied out as they
// are then, so nothing is copied in backward and nothing is watched, but the parameters of which
// the host keeps fp32 masters (master_weights), whose writes replace their masters.
#include <ATen/core/grad_mode.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "base/errors.hpp"
#include "python/tensors/adam_slots.hpp"
#include "python/tensors/check_mode.hpp"

namespace stowage::torch_offload {

namespace {

// Whether two CPU tensors of one dtype hold the same bytes (NaNs compared as bits).
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor left = a.contiguous();
  const at::Tensor right = b.to(a.scalar_type()).contiguous();
  return left.numel() == right.numel() && std::memcmp(left.const_data_ptr(), right.const_data_ptr(), left.nbytes()) == 0;
}

}  // namespace

AdamSlots::Prepared AdamSlots::prepare_staged_step(const StepInputs& inputs) {
  STOWAGE_CHECK(inputs.grads.size() == slots_.size() && inputs.grad_shards.size() == slots_.size() &&
                    inputs.shards.size() == slots_.size(),
                "step() inputs for ", inputs.grads.size(), " of ", slots_.size(), " offloaded parameters");
  Prepared prepared;
  Indices all;
  for (std::size_t slot = 0; slot < slots_.size(); ++slot) all.push_back(slot);
  const Indices mastered = with_host_copy(all);
  Tensors mastered_shards;
  for (const std::size_t slot : mastered) mastered_shards.push_back(inputs.shards[slot]);
  take_written(mastered, mastered_shards);  // (a write between steps replaces the master)
  if (inputs.skip) {
    discard_step();
    prepared.skipped = true;
    return prepared;
  }
  check_options(inputs.groups);
  try {
    for (std::size_t slot = 0; slot < slots_.size(); ++slot) {
      const at::Tensor& grad = inputs.grads[slot];
      if (!grad.defined()) continue;
      refuse_sparse(slot, grad);
      for (const at::Tensor* tensor : {&inputs.grad_shards[slot], &inputs.shards[slot]}) {
        if (tensor->numel() == slots_[slot].numel) continue;
        throw std::invalid_argument(where() + ": " + std::string(tensor == &inputs.shards[slot] ? "" : "the gradient of ") +
                                    name_of_(slot) + " has " + std::to_string(tensor->numel()) +
                                    " elements where the parameter had " + std::to_string(slots_[slot].numel) +
                                    "; make a new optimizer for parameters of a new shape");
      }
      book_.arrive(slot, inputs.grad_shards[slot]._version());
    }
  } catch (...) {
    book_.reset_arrivals();  // nothing applied: step() may be called again
    throw;
  }
  return prepared;
}

void AdamSlots::commit_staged_step(const StepInputs& inputs, const Landed& landed) {
  const double scale = step_scale(inputs);
  offload::StepWork work = step_work(inputs.shards, [this, scale, &inputs](std::size_t bucket) {
    stage(bucket, inputs, scale);
  });
  if (landed) work.landed = [this, &landed](std::size_t bucket) { landed(bucket, buckets_[bucket].returned); };
  offload::run_staged_step(book_, work, ring_->slot_count());
}

void AdamSlots::stage(std::size_t bucket, const StepInputs& inputs, double grad_scale) {
  if (book_.arrived_in(bucket) == 0) return;
  const at::NoGradGuard no_grad;
  const HostBucket& host = *buckets_[bucket].host;
  const StagingRing::Slot& ring_slot = ring_->take(bucket);  // (its last write-back has finished)
  const at::Tensor parameters = ring_slot.parameters_as(host.numel(), host.dtype());
  const at::Tensor gradients = ring_slot.gradients_as(host.numel(), host.dtype());
  const std::size_t first = book_.first_slot(bucket);
  for (std::size_t slot = first; slot < first + book_.size(bucket); ++slot) {
    if (!book_.arrived(slot)) continue;
    const Slot& s = slots_[slot];
    transfers_->copy_out(parameters.narrow(0, s.offset, s.numel), inputs.shards[slot].detach());
    transfers_->copy_out(gradients.narrow(0, s.offset, s.numel), inputs.grad_shards[slot].detach());
  }
  check_staged(bucket, inputs, parameters, gradients);
  UpdateBuffers buffers;
  if (host.master().defined()) {  // fp32 masters: the staged parameters take the update's output
    buffers.parameters = host.master().data_ptr();
    buffers.output = parameters.data_ptr();
  } else {
    buffers.parameters = parameters.data_ptr();
  }
  buffers.gradients = gradients.const_data_ptr();
  buffers.held = {ring_slot.parameters, ring_slot.gradients};
  if (const std::optional<CopyMark> copied = transfers_->copies_out_issued()) buffers.waits.push_back(*copied);
  submit_over(bucket, inputs.groups.at(buckets_[bucket].group), grad_scale, std::move(buffers), parameters);
}

// Check mode: what the copies out staged is, bit for bit, what the device holds. Thrown from the
// bucket's update part before its update: the part runs again (copies again) and the step finishes
// before the error is raised (Note [Whole steps]).
void AdamSlots::check_staged(std::size_t bucket, const StepInputs& inputs, const at::Tensor& parameters,
                             const at::Tensor& gradients) {
  if (!check_mode()) return;
  transfers_->synchronize();
  const std::size_t first = book_.first_slot(bucket);
  for (std::size_t slot = first; slot < first + book_.size(bucket); ++slot) {
    if (!book_.arrived(slot)) continue;
    const Slot& s = slots_[slot];
    for (const bool gradient : {false, true}) {
      const at::Tensor& staged = gradient ? gradients : parameters;
      const at::Tensor& now = gradient ? inputs.grad_shards[slot] : inputs.shards[slot];
      if (same_bits(staged.narrow(0, s.offset, s.numel), now.detach().reshape(-1).cpu())) continue;
      throw std::runtime_error("stowage check: " + std::string(gradient ? "the gradient of " : "") + name_of_(slot) +
                               " copied out at step " + std::to_string(steps_ended()) + " is not, bit for bit, what "
                               "the device holds: the copy out corrupted it. It was copied again and the step "
                               "finished from that copy.");
    }
  }
}

}  // namespace stowage::torch_offload
