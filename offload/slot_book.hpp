// SlotBook: the offloaded optimizer's bookkeeping of one step, as numbers. Each offloaded
// parameter is a slot (numbered in bucket order, Note [Optimizer buckets]); the book knows which
// slots' gradients have been copied out this step and at which version, which buckets have all
// their gradients (ready for an update), which buckets have an update submitted and which slots it
// covers, which updates are provisional (update="in_backward", undone by a rollback) or pending
// (update="delayed", written back at the next step), and which gradient staging buffer this step
// uses. Nothing here knows about tensors: the torch layer (python/tensors/adam_slots.hpp)
// copies, updates and writes back by what the book says.
//
// Note [Offloaded optimizer semantics]
// A parameter is updated if and only if its gradient is there at step(); the gradient used is the
// one present at step(), whoever changed it, and the options used are the param group's at step().
// With update="exact" every slot with a gradient at step() arrives then, and its parameter and
// gradient are copied out as they are then (Note [Staged buckets] in adam_buckets.hpp): nothing
// below about backward applies. In the other modes a slot's gradient is copied out once it is final: once every post-accumulate hook of its
// parameter has run (the optimizer's hook fires among them: where hooks were registered after
// it, it copies the gradient when the next parameter's fires, or at the end of backward; else at
// once), or from DDP's reduced bucket; it is counted as arrived, and a checksum of the bytes
// copied is kept. A bucket whose slots have all arrived is ready: "in_backward" updates it at
// once (provisionally), "delayed" at step(). step() compares the gradients present with
// the checksums, copies again those that changed since (replaced, written, by anyone) and forgets
// those dropped, so that what is updated is what torch's optimizer would see; "in_backward"
// refuses a change to a gradient a provisional update already read, and undoes and makes again a
// provisional update whose group's options changed since. A backward that raises, a zero_grad()
// without step(), or a skipped step (an inf under a GradScaler) forgets the arrivals and undoes
// the provisional updates: nothing of them is applied.
//
// Note [Whole steps]
// A step() is all or nothing: whatever interrupts it (Ctrl-C, an error), parameters and states
// (step counts, moments, amsgrad's maxima, the states kept on the device) are left both as before
// the step or both as after it, and so is a state_dict taken then. Until the first state changes
// (checks, copies, the device share's update not yet begun), an error leaves nothing applied:
// provisional updates are undone, the arrivals stay, and step() may be called again. From there
// on the step is finished whatever is raised (each part resumes where it stopped: a bucket
// submitted or written back is not again) and the error is raised after. Ctrl-C is held for the
// whole step: Python's handler only notes it and the waits on the step's thread and the update
// threads go on (InterruptHold, base/interrupt_watch.hpp) to their deadlines
// (Note [Bounded waits]); KeyboardInterrupt is raised once the step is whole. The host memory
// an interrupted copy or update still uses is never freed under it: the updates hold their
// bucket's memory, and the optimizer's end waits for its copies (or leaks what they use).
// With overlap=True the host part runs after step() has returned (Note [Overlapped steps] in
// step_order.hpp): whole means the same of it, and its error is raised at the first wait that meets
// it once the step has ended, instead of from step().
//
// Invariants (check_invariants()): a bucket's arrived count is the number of its slots with a
// version; an update's slots are its bucket's; a pending bucket has an update; "delayed" alone has
// pending buckets and two staging buffers.
//
// Contract: not thread-safe (the optimizer calls it under its lock); slots and buckets are added,
// never removed. Misuse (a slot or bucket that does not exist) throws LogicError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace stowage::offload {

enum class UpdateMode { kExact, kInBackward, kDelayed };

// "exact", "in_backward" or "delayed"; LogicError for anything else.
[[nodiscard]] UpdateMode parse_update_mode(std::string_view name);

class SlotBook {
 public:
  explicit SlotBook(UpdateMode mode) noexcept : mode_(mode) {}

  UpdateMode mode() const noexcept { return mode_; }
  // Gradient buffers a bucket keeps where gradients are copied out in backward: two with delayed
  // updates (the next step's gradients arrive while the last step's update reads the other), else
  // one (exact mode stages them through a ring instead and keeps none).
  int grad_buffers() const noexcept { return mode_ == UpdateMode::kDelayed ? 2 : 1; }
  // Sets of update states a bucket keeps: two where updates are provisional ("in_backward": they
  // are written out of place, Note [Provisional updates out of place] in
  // python/tensors/host_bucket.hpp), else one.
  int state_sets() const noexcept { return mode_ == UpdateMode::kInBackward ? 2 : 1; }
  // The staging buffer this step's gradients go to.
  int grad_buffer() const noexcept { return grad_buffer_; }

  // Adds a bucket of `count` slots, numbered after the last ones; returns the bucket's number.
  std::size_t add_bucket(std::size_t count);
  std::size_t slot_count() const noexcept { return slots_.size(); }
  std::size_t bucket_count() const noexcept { return buckets_.size(); }
  std::size_t bucket_of(std::size_t slot) const;
  // The bucket's slots: [first_slot, first_slot + size).
  std::size_t first_slot(std::size_t bucket) const;
  std::size_t size(std::size_t bucket) const;

  // --- arrivals (Note [Offloaded optimizer semantics]) ---
  // `slot`'s gradient was copied out at `version`. Returns whether its bucket now has all its
  // gradients.
  bool arrive(std::size_t slot, std::int64_t version);
  // `slot`'s gradient is gone: it no longer counts as arrived.
  void drop(std::size_t slot);
  std::optional<std::int64_t> version(std::size_t slot) const;
  bool arrived(std::size_t slot) const { return version(slot).has_value(); }
  std::size_t arrived_in(std::size_t bucket) const;
  bool ready(std::size_t bucket) const { return arrived_in(bucket) == size(bucket); }
  // Which of the bucket's slots have arrived, in bucket order.
  std::vector<bool> has_gradient(std::size_t bucket) const;
  // Forgets every arrival (and that the parameters were checked this step).
  void reset_arrivals() noexcept;
  // in_backward: whether the parameters' writes were taken this step (once, at the first arrival).
  bool parameters_checked() const noexcept { return parameters_checked_; }
  void set_parameters_checked() noexcept { parameters_checked_ = true; }

  // --- updates ---
  // The arrived slots of `bucket` are in the update just submitted for it; returns them.
  std::vector<std::size_t> submitted(std::size_t bucket);
  bool updated(std::size_t bucket) const;
  // The slots the bucket's update covers (empty when it has none).
  const std::vector<std::size_t>& updated_slots(std::size_t bucket) const;
  // The bucket's update was written back or undone: it has none any more.
  void clear_update(std::size_t bucket);
  bool pending(std::size_t bucket) const;
  // Updates submitted and neither written back nor pending (in_backward's provisional ones).
  std::vector<std::size_t> provisional() const;
  // Slots whose bucket has an update / has none.
  std::vector<std::size_t> slots_updated(bool updated) const;
  // delayed: this step's updates become pending, and the next step's gradients go to the other
  // staging buffer. Returns the pending buckets.
  const std::vector<std::size_t>& hold_pending();
  const std::vector<std::size_t>& pending_buckets() const noexcept { return pending_; }
  void clear_pending() noexcept { pending_.clear(); }
  // The end of a step: in_backward's updates stood (they are written back), the arrivals go.
  void end_step() noexcept;
  // A skipped step: end_step(), and the updates that are not pending are forgotten.
  void discard_step() noexcept;

  // Throws InternalError when an invariant above does not hold.
  void check_invariants() const;

 private:
  struct Bucket {
    std::size_t first = 0;
    std::size_t size = 0;
    std::size_t arrived = 0;
    bool updated = false;
    std::vector<std::size_t> updated_slots;
  };

  const Bucket& bucket_at(std::size_t bucket) const;
  Bucket& bucket_at(std::size_t bucket);
  void check_slot(std::size_t slot) const;

  UpdateMode mode_;
  std::vector<std::optional<std::int64_t>> versions_;  // per slot: the arrived gradient's version
  std::vector<std::size_t> slots_;                     // per slot: its bucket
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> pending_;  // delayed: updated on the host, not yet written back
  int grad_buffer_ = 0;
  bool parameters_checked_ = false;
};

}  // namespace stowage::offload
