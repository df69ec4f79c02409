// AdamSlots' step(): the order of its checks and copies, and the work of the parts
// offload/step_order.hpp runs whole (Note [Whole steps], adam_slots.hpp).
#include <stdexcept>
#include <string>
#include <utility>

#include "python/tensors/adam_slots.hpp"
#include "python/tensors/check_mode.hpp"

namespace stowage::torch_offload {

namespace {

AdamSlots::Tensors subset(const AdamSlots::Tensors& tensors, const AdamSlots::Indices& slots) {
  AdamSlots::Tensors out;
  out.reserve(slots.size());
  for (const std::size_t slot : slots) out.push_back(tensors.at(slot));
  return out;
}

}  // namespace

double AdamSlots::step_scale(const StepInputs& inputs) const {
  if (inputs.skip) return 1.0;
  double scale = 1.0 / inputs.grad_scale;
  if (clip_.defined()) scale *= clip_.item<double>();
  return scale;
}

void AdamSlots::clip_by(const at::Tensor& coefficient) {
  clip_ = clip_.defined() ? clip_.mul(coefficient) : coefficient;
}

std::vector<std::pair<std::size_t, bool>> AdamSlots::take_state_changes() {
  return std::exchange(state_changes_, {});
}

void AdamSlots::refuse(const std::string& message) {
  roll_back();
  discard_step();
  throw std::runtime_error(where() + "(update='in_backward')" + message + " Nothing was applied.");
}

AdamSlots::Prepared AdamSlots::prepare_step(const StepInputs& inputs) {
  if (staged()) return prepare_staged_step(inputs);
  Prepared prepared;
  try {
    const bool delayed = book_.mode() == offload::UpdateMode::kDelayed;
    const bool in_backward = book_.mode() == offload::UpdateMode::kInBackward;
    if (delayed) finish_pending();
    take_parameters_for_step(inputs);
    if (in_backward) {
      check_in_backward_exact(inputs, step_scale(inputs));
      if (redo_outdated_updates(inputs)) {
        prepared.warnings.push_back(
            where() + "(update='in_backward'): a param group's options (lr, betas, ...) changed between backward and "
            "step(), so step() undoes the updates made during backward with the old ones and makes them again; "
            "change them after step() (a scheduler's step() included) to keep the overlap.");
      }
    }
    if (delayed) write_back_pending(inputs.shards);
    if (inputs.skip) {
      discard_step();
      prepared.skipped = true;
      return prepared;
    }
    if (collect_late(inputs.grads, inputs.grad_shards)) {
      prepared.warnings.push_back(where() + ": gradients changed after backward (clipping or unscaling through "
                                  "torch?), so step() copies them out again. optimizer.clip_grad_norm_() clips "
                                  "without that copy.");
    }
    check_gradients_copied(inputs.grad_shards);
    check_options(inputs.groups);
  } catch (...) {
    roll_back();  // the arrivals stay: step() may be called again
    throw;
  }
  return prepared;
}

// Written parameters become masters before this step's updates read them. In_backward, a bucket
// already updated cannot take a write made after its update: refused.
void AdamSlots::take_parameters_for_step(const StepInputs& inputs) {
  Indices slots;
  if (book_.mode() == offload::UpdateMode::kInBackward) {
    const Indices updated = book_.slots_updated(true);
    const Indices late = written(updated, subset(inputs.shards, updated));
    if (!late.empty()) {
      refuse(": " + name_of_(late.front()) + " was written after backward updated it, before step(); that update "
             "does not see the write. Write parameters after step() (or before backward), or use update='exact'.");
    }
    slots = book_.slots_updated(false);
  } else {
    for (std::size_t slot = 0; slot < slots_.size(); ++slot) slots.push_back(slot);
  }
  take_written(slots, subset(inputs.shards, slots));
}

// Buckets updated during backward took the gradients as they were copied out, unscaled: refused
// when the step needs something else of them.
void AdamSlots::check_in_backward_exact(const StepInputs& inputs, double scale) {
  const std::int64_t stale = stale_gradients(inputs.grads, inputs.grad_shards);
  if (stale < 0) return;  // nothing ran ahead: step() updates every bucket as "exact" would
  if (scale == 1.0 && !inputs.inf_checked && stale == 0) return;
  refuse(" already updated from the gradients as backward left them, but they were changed afterwards (a "
         "GradScaler, clipping through torch, or " + std::to_string(stale) + " gradients replaced, dropped or "
         "written after backward): that update does not match them. Use update='exact' (the default) with loss "
         "scaling or gradient edits, or clip with optimizer.clip_grad_norm_().");
}

// in_backward: updates made during backward with options their param group no longer has are
// undone, and step() makes them again with the options it finds, as "exact" would.
bool AdamSlots::redo_outdated_updates(const StepInputs& inputs) {
  const Indices outdated = outdated_updates(inputs.groups);
  if (outdated.empty()) return false;
  roll_back(outdated);
  return true;
}

void AdamSlots::check_gradients_copied(const Tensors& grad_shards) {
  if (!check_mode()) return;
  const std::int64_t index = first_changed_gradient(grad_shards);
  if (index < 0) return;
  throw std::runtime_error("stowage check: the gradient of " + name_of_(static_cast<std::size_t>(index)) +
                           " copied out at step " + std::to_string(steps_ended()) + " is not, bit for bit, the "
                           "gradient present at step(): it was changed in a way the content watch did not see, or "
                           "the copy out corrupted it. Nothing of the step was applied.");
}

offload::StepWork AdamSlots::step_work(const Tensors& shards, std::function<void(std::size_t)> update) {
  return {std::move(update), [this, &shards](std::size_t bucket) { write_back(bucket, shards); },
          [this] {
            if (book_.mode() == offload::UpdateMode::kDelayed) {
              book_.hold_pending();
            } else {
              transfers_->written_back();
            }
            end_step();
          },
          at_point_, nullptr};
}

void AdamSlots::commit_step(const StepInputs& inputs, const Landed& landed) {
  if (staged()) return commit_staged_step(inputs, landed);
  STOWAGE_CHECK(!landed, "only update='exact' (staged) lands its buckets one by one");
  const double scale = step_scale(inputs);
  offload::run_step(book_, step_work(inputs.shards, [this, scale, &inputs](std::size_t bucket) {
                      submit(bucket, inputs.groups.at(buckets_[bucket].group), scale);
                    }));
}

// delayed: the last step's updates written back, whole.
void AdamSlots::write_back_pending(const Tensors& shards) {
  try {
    offload::run_pending_write_backs(book_, step_work(shards, nullptr));
  } catch (...) {
    book_.clear_pending();
    transfers_->written_back();
    throw;
  }
  book_.clear_pending();
  transfers_->written_back();
}

// Check mode: each parameter written back is, bit for bit, what the host update made.
void AdamSlots::check_arrivals(const Indices& slots, const Tensors& shards, const Tensors& results) {
  if (!check_mode() || slots.empty()) return;
  const std::int64_t index = first_changed_arrival(slots, shards, results);
  if (index < 0) return;
  throw std::runtime_error("stowage check: " + name_of_(static_cast<std::size_t>(index)) + ", arrived changed at "
                           "step " + std::to_string(steps_ended()) + ": its bytes on the device differ from the host "
                           "update's. The copy back (the link, or host memory) corrupted it; the step was finished "
                           "and its update stands on the host.");
}

void AdamSlots::flush(const Tensors& shards) {
  roll_back();
  finish_pending();
  Indices pending;
  for (const std::size_t bucket : book_.pending_buckets()) {
    const std::size_t first = book_.first_slot(bucket);
    for (std::size_t slot = first; slot < first + book_.size(bucket); ++slot) pending.push_back(slot);
  }
  take_written(pending, subset(shards, pending));
  write_back_pending(shards);
  transfers_->synchronize();
}

}  // namespace stowage::torch_offload
