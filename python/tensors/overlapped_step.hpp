// OverlappedStep: one update="exact" step's host part (AdamSlots::commit_step) run behind the
// loop on a thread of its own (Note [Overlapped steps] in offload/step_order.hpp), for
// stowage.offload.Adam(overlap=True). It owns what the step reads (the step's inputs: the
// parameters and gradients as they were at step(), held until the step has ended, so that a
// gradient dropped meanwhile keeps its memory until its copy out has read it) and the thread
// (offload/pending_step.hpp). The thread runs on the device's stream current at step(), so that its
// copies follow the compute that made the gradients.
//
// Contract: made, waited on and finished from the optimizer's thread; while it is pending the
// AdamSlots it runs on belongs to its thread (the optimizer calls nothing else on them until
// finish() has returned). The slots must outlive it; the destructor waits for the step's end and
// drops an error finish() did not raise.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <memory>

#include "offload/pending_step.hpp"
#include "python/tensors/adam_slots.hpp"

namespace stowage::torch_offload {

class OverlappedStep {
 public:
  // Starts `inputs`' step (prepared: AdamSlots::prepare_step returned, not skipped).
  OverlappedStep(AdamSlots& slots, AdamSlots::StepInputs inputs, const c10::Device& device);
  ~OverlappedStep();
  OverlappedStep(const OverlappedStep&) = delete;
  OverlappedStep& operator=(const OverlappedStep&) = delete;

  // Blocks until the bucket's write-back has been issued (or the step has ended), then makes the
  // current compute wait for that copy (on a GPU, a stream wait: the host does not wait for the
  // copy). Rethrows the step's error once it has ended with one not raised yet.
  void wait_landed(std::size_t bucket);
  // Blocks until the step has ended; rethrows its error if not raised yet.
  void finish();
  bool ended() const { return pending_->ended(); }

 private:
  AdamSlots::StepInputs inputs_;
  std::unique_ptr<offload::PendingStep> pending_;  // last: its thread reads the rest
};

}  // namespace stowage::torch_offload
