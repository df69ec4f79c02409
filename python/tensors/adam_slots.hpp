// AdamSlots: the offloaded optimizer's parameters in host memory and what happens to them in a
// step, for stowage.offload.Adam (which observes torch and calls in here). It owns the host
// buckets (host_bucket.hpp, laid out by offload/adam_buckets.hpp), each offloaded parameter's
// views in them (a "slot": moments, step count, master where the host keeps one), the step's
// bookkeeping (offload/slot_book.hpp, Note [Offloaded optimizer semantics]), the copies on the
// offload engine (optimizer_transfers.hpp), the queue the updates run on
// (offload/update_queue.hpp) and the buffers the updates read, in one of two layouts chosen by
// the update mode:
// - update="exact": staged (Note [Staged buckets]): at step() each bucket's parameters and
//   gradients, as they are then, go through a bounded ring (staging_ring.hpp); nothing is copied
//   in backward, and no watch is needed but the parameters' where the host keeps fp32 masters of
//   narrower ones (master_weights);
// - "in_backward" and "delayed": kept (bucket_buffers.hpp): each bucket's parameters' copy and
//   gradient buffers persist, gradients are copied out as backward finalises them, and two content
//   watches (content_watch.hpp) hold the parameters as last written back or taken and the
//   gradients as each was copied out, so that a change made by anyone (a hook, a write that leaves
//   versions alone, a tensor put in its place) is seen.
//
// Slots are numbered in bucket order as they join; the caller keeps the parameter of each number
// and hands in, where a call needs them, the tensors as they are now: the parameters' local
// shards (FSDP2: this rank's part; `shards`), the gradients (`grads`, identity compared: a
// gradient replaced is a new tensor) and their local shards. A missing gradient is an undefined
// tensor (None).
//
// Errors the user causes name the parameter through `name_of` (the optimizer's "parameter 3
// (group 0, shape [64, 24])") and come as std::invalid_argument (ValueError) or
// std::runtime_error (RuntimeError); misuse by the caller is LogicError.
//
// A step() is two calls (Note [Whole steps]): prepare_step() does all that comes before the host
// states change (the checks, the gradients and parameters taken) and, raising, leaves nothing
// applied; the caller then updates the device share (torch's optimizer) and commit_step() runs the
// host part (in offload/step_order.hpp's order) to its end whatever is raised in it. `at_point`,
// called with the name of each point of a step ("update <bucket>", "write_back <bucket>", "end"),
// is a test seam that may throw there.
//
// Contract: one thread at a time: the optimizer's, under its lock, or, while an overlapped step is
// pending (overlapped_step.hpp), the thread running its commit_step (the optimizer calls nothing
// here until that step has ended). Every call may wait for the
// host update or the copies and may be made without the GIL (name_of and at_point take it back).
// Each call either does all it says or, when it throws, leaves the book as it was or resumable by
// calling it again (Note [Whole steps]). The destructor waits for the copies still using the host
// buffers.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "offload/adam_buckets.hpp"
#include "offload/slot_book.hpp"
#include "offload/step_order.hpp"
#include "offload/update_queue.hpp"
#include "python/tensors/content_watch.hpp"
#include "python/tensors/bucket_buffers.hpp"
#include "python/tensors/host_bucket.hpp"
#include "python/tensors/host_state_store.hpp"
#include "python/tensors/optimizer_transfers.hpp"
#include "python/tensors/staging_ring.hpp"

namespace stowage::torch_offload {

// The host states of parameters joining would take more host memory than the process may use
// (bound as stowage.offload.HostMemoryError, a MemoryError).
class HostMemoryShortage : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A param group's options, as the update takes them.
struct GroupOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled_weight_decay = false, maximize = false, amsgrad = false;

  bool operator==(const GroupOptions&) const = default;
};

// One slot's states, in the parameter's local shape: torch's state entry.
struct SlotStates {
  at::Tensor step, master, exp_avg, exp_avg_sq;
  at::Tensor max_exp_avg_sq;  // undefined without amsgrad
  bool own_master = false;    // fp32 masters of a parameter that is not fp32 (master_weights)
};

class AdamSlots {
 public:
  using Tensors = std::vector<at::Tensor>;
  using Indices = std::vector<std::size_t>;

  using Point = std::function<void(const std::string&)>;
  AdamSlots(const c10::Device& device, std::string owner, offload::UpdateMode mode, const std::vector<int>& cpus,
            bool master_weights, std::int64_t bucket_numel, std::optional<std::uint64_t> host_memory_limit,
            std::function<std::string(std::size_t)> name_of, Point at_point);
  ~AdamSlots();
  AdamSlots(const AdamSlots&) = delete;
  AdamSlots& operator=(const AdamSlots&) = delete;

  HostStateStore& store() noexcept { return *store_; }
  const offload::UpdateQueue& queue() const noexcept { return *queue_; }
  const offload::SlotBook& book() const noexcept { return book_; }
  offload::SlotBook& book_mutable() noexcept { return book_; }
  double watch_seconds() const noexcept { return parameters_.seconds() + gradients_.seconds(); }
  // The staging ring's host bytes (0: buckets keep their buffers).
  std::int64_t staging_bytes() const noexcept { return ring_ == nullptr ? 0 : ring_->bytes(); }
  // Bytes in_backward's provisional updates copied between the two sets of states (the elements of
  // parameters without a gradient: Note [Provisional updates out of place]).
  std::int64_t copied_bytes() const noexcept {
    std::int64_t copied = 0;
    for (const Bucket& bucket : buckets_) copied += bucket.host->copied_bytes();
    return copied;
  }
  std::size_t size() const noexcept { return slots_.size(); }

  // --- joining: parameters `shards` of param groups `groups` (numbers the caller gives) ---
  // Host bytes their buckets would take (Note [Optimizer buckets]), the staging ring's growth
  // included (Note [Staged buckets]).
  std::int64_t host_bytes(const Tensors& shards, const Indices& groups, const std::vector<bool>& amsgrad) const;
  // Lays out their buckets; masters start from the shards. Returns, for each new slot in number
  // order, the position in `shards` of its parameter. Throws HostMemoryShortage, nothing joined,
  // when the buckets need more than the host room (device/host_memory_probe.hpp) left under the
  // host memory limit by the states already laid out.
  Indices join(const Tensors& shards, const Indices& groups, const std::vector<bool>& amsgrad);
  std::size_t group_of(std::size_t bucket) const;
  SlotStates states(std::size_t slot) const;

  // --- gradients ---
  // Copies `slot`'s gradient out (its bytes' checksum taken as it leaves) and counts it: returns
  // the bucket made ready by it, -1 when it is not ready, kArrivedTwice (nothing done) when
  // in_backward already updated the bucket.
  static constexpr std::int64_t kArrivedTwice = -2;
  std::int64_t arrive(std::size_t slot, const at::Tensor& gradient, const at::Tensor& shard);

  // --- parameters written by someone else ---
  // The slots whose parameter's bytes changed since they were last written back or taken become
  // the masters (and the outputs a delayed write-back sends); returns them.
  Indices take_written(const Indices& slots, const Tensors& shards);
  // The slots' parameters as they are now are the reference.
  void parameters_are(const Indices& slots, const Tensors& shards);

  // --- a step() ---
  // What step() sees of torch: each slot's gradient and its local shard (undefined: none), each
  // slot's parameter shard, the param groups' options, the GradScaler's scale, whether it handed
  // over an inf check and whether that found one (the step is skipped).
  struct StepInputs {
    Tensors grads, grad_shards, shards;
    std::vector<GroupOptions> groups;
    double grad_scale = 1.0;
    bool inf_checked = false, skip = false;
  };
  // Whether the step was skipped, and what the caller warns of (once per optimizer each, the caller's
  // choice): in_backward's updates made with outdated options were undone, to be made again;
  // gradients changed after backward were copied out again.
  struct Prepared {
    bool skipped = false;
    std::vector<std::string> warnings;
  };
  // Before the host states change: delayed's pending update written back, parameters written
  // since taken as masters, gradients not copied out (or changed since) copied, check mode's
  // comparison of the gradients, the options checked. Staged (update="exact"): the writes to
  // parameters with fp32 masters taken, every slot with a gradient counted as arrived (a sparse
  // one, or one of another size, refused), the options checked; nothing is copied yet. in_backward refuses (runtime_error, the
  // step discarded) a parameter written after its bucket was updated, and gradients changed
  // after the updates that read them. Throwing, it leaves nothing applied (provisional updates
  // undone, the arrivals kept: step() may be called again).
  Prepared prepare_step(const StepInputs& inputs);
  // Each bucket's update not made yet, then (not delayed) each bucket's write-back, then the end:
  // each part runs again where it threw and the first error is rethrown after the last. Staged,
  // a bucket's update part first copies its parameters and gradients into its ring slot, and the
  // write-backs interleave with the updates (offload/step_order.hpp's run_staged_step). Check
  // mode compares each parameter written back with the host's result (and, staged, each copy out
  // with the device's bytes).
  // `landed` (staged only; may be empty): called as each bucket's write-back part ends, with the
  // mark of its write-back (nullopt: complete already), from the thread running the step (Note
  // [Overlapped steps]).
  using Landed = std::function<void(std::size_t bucket, const std::optional<CopyMark>& written_back)>;
  void commit_step(const StepInputs& inputs, const Landed& landed = {});
  // optimizer.clip_grad_norm_'s coefficient (a tensor, read at step()); the step's end forgets it.
  void clip_by(const at::Tensor& coefficient);
  // Makes states and parameters those of the last step(): provisional updates undone, delayed's
  // pending update waited for and written back (parameters written since taken first).
  void flush(const Tensors& shards);
  // The slots whose state entry began (true: their first update was submitted) or went (false:
  // an undo took their step count back to 0) since the last call, in order.
  std::vector<std::pair<std::size_t, bool>> take_state_changes();

  // --- updates ---
  // Queues the bucket's update when it has gradients (the gradients scaled by `grad_scale`; its
  // step counts incremented now); returns the slots updated.
  Indices submit(std::size_t bucket, const GroupOptions& options, double grad_scale);
  // Undoes in_backward's provisional updates: waits for them to end, however they ended, and
  // restores the states and step counts they began from.
  void roll_back() { roll_back(book_.provisional()); }
  void reset_arrivals() noexcept { book_.reset_arrivals(); }

 private:
  struct Slot {
    std::size_t bucket = 0;
    std::int64_t offset = 0;
    std::int64_t numel = 0;
    std::vector<std::int64_t> shape;
    SlotStates states;
  };
  struct Bucket {
    std::unique_ptr<HostBucket> host;
    std::unique_ptr<BucketBuffers> kept;  // null: staged through the ring
    std::size_t group = 0;
    std::optional<CopyMark> copied;    // this step's copies out
    std::optional<CopyMark> returned;  // the last write-back
    std::shared_ptr<offload::UpdateTicket> ticket;
    GroupOptions options;      // its update's, while it has one
    at::Tensor written_back;  // flat: what its update's write-back copies, while it has one
  };

  // Per slot: whether it arrived and the gradient present now is not, byte for byte, the one
  // copied out (dropped, or changed since by anyone; one pass over them and one sync).
  std::vector<bool> changed_gradients(const Tensors& grads, const Tensors& shards);
  // At step(): copies the gradients not copied out in backward, or changed since, and forgets
  // those dropped. Returns whether an arrived gradient had to be copied again.
  bool collect_late(const Tensors& grads, const Tensors& shards);
  // in_backward: how many of the gradients the updates made in backward read changed since
  // (-1: no update was made in backward).
  std::int64_t stale_gradients(const Tensors& grads, const Tensors& shards);
  // Check mode: after the copies, the first arrived slot whose host copy of its gradient is not
  // bit for bit the gradient's local shard now (`shards`; -1: none). Sees what the content
  // watch cannot: a change its checksums miss, a copy corrupted on the way out.
  std::int64_t first_changed_gradient(const Tensors& shards);
  // The slots whose parameter's bytes changed since they were last written back or taken.
  Indices written(const Indices& slots, const Tensors& shards);
  // Refuses (invalid_argument) options the host states cannot take (amsgrad turned on after
  // the states were made), before anything of a step is submitted.
  void check_options(const std::vector<GroupOptions>& groups) const;
  // in_backward: the provisional updates made with options other than their group's now (a
  // scheduler stepped, or lr set, between backward and step()).
  Indices outdated_updates(const std::vector<GroupOptions>& groups) const;
  bool staged() const noexcept { return ring_ != nullptr; }
  // The slots whose host keeps a copy of the parameter (kept buffers, or fp32 masters of narrower
  // parameters): those whose writes the parameters' watch must see.
  Indices with_host_copy(const Indices& slots) const;
  // update="exact" (Note [Staged buckets]): prepare_step's part, the step's host part, and one
  // bucket's parameters and gradients copied into its ring slot and its update submitted.
  Prepared prepare_staged_step(const StepInputs& inputs);
  void commit_staged_step(const StepInputs& inputs, const Landed& landed);
  void stage(std::size_t bucket, const StepInputs& inputs, double grad_scale);
  void check_staged(std::size_t bucket, const StepInputs& inputs, const at::Tensor& parameters,
                    const at::Tensor& gradients);
  // Submits the bucket's update over `buffers`, its write-back to copy `written_back`.
  Indices submit_over(std::size_t bucket, const GroupOptions& options, double grad_scale, UpdateBuffers buffers,
                      at::Tensor written_back);
  // Waits for the bucket's update (Note [Bounded waits]) and rethrows what it threw.
  void finish(std::size_t bucket);
  void finish_pending();
  // Waits for the update and starts writing back its slots' parameters (`shards`: every slot's).
  void write_back(std::size_t bucket, const Tensors& shards);
  // Check mode: after the copies, the first slot whose parameter is not bit for bit what the
  // update made, `results` (-1: none).
  std::int64_t first_changed_arrival(const Indices& slots, const Tensors& shards, const Tensors& results);
  // Undoes the provisional updates of `buckets` (roll_back()); the slots whose step count is back
  // to 0 lose their state entry.
  void roll_back(const Indices& buckets);
  // The step's updates stand; the arrivals and the clipping coefficient go.
  void end_step();
  // A skipped step: nothing of it applied (pending updates stay).
  void discard_step();
  std::vector<offload::BucketPlan> plan(const Tensors& shards, const Indices& groups) const;
  void check_host_room(std::uint64_t needed) const;
  void take_parameters_for_step(const StepInputs& inputs);
  void check_in_backward_exact(const StepInputs& inputs, double scale);
  bool redo_outdated_updates(const StepInputs& inputs);
  // What the step's parts do (offload/step_order.hpp): `update`, the write-backs of `shards`,
  // the end.
  offload::StepWork step_work(const Tensors& shards, std::function<void(std::size_t)> update);
  void write_back_pending(const Tensors& shards);
  void check_gradients_copied(const Tensors& grad_shards);
  // Check mode: the slots' parameters just written back are, bit for bit, their update's result
  // (before the bucket's buffers are used again).
  void check_arrivals(const Indices& slots, const Tensors& shards, const Tensors& results);
  // in_backward's refusals: the updates made undone and the step discarded, then thrown.
  [[noreturn]] void refuse(const std::string& message);
  double step_scale(const StepInputs& inputs) const;
  std::string where() const { return "stowage.offload." + owner_; }
  void copy_out(std::size_t slot, const at::Tensor& shard);
  // Refuses (runtime_error, naming the parameter) a sparse gradient, as torch's Adam does.
  void refuse_sparse(std::size_t slot, const at::Tensor& gradient) const;
  void clear_update(std::size_t bucket);
  // Waits until the bucket's update has ended (done or thrown), without taking its outcome.
  void wait_ended(std::size_t bucket);
  void check_options(const Bucket& bucket, const GroupOptions& options) const;

  c10::Device device_;
  std::string owner_;
  bool master_weights_;
  std::int64_t bucket_numel_;
  std::optional<std::uint64_t> host_memory_limit_;  // the bytes all the states may take; nullopt: no limit
  std::function<std::string(std::size_t)> name_of_;
  Point at_point_;
  at::Tensor clip_;  // the step's clipping coefficient, until its end
  std::vector<std::pair<std::size_t, bool>> state_changes_;
  offload::SlotBook book_;
  std::unique_ptr<HostStateStore> store_;
  std::unique_ptr<OptimizerTransfers> transfers_;
  ContentWatch parameters_;  // as last written back (or taken)
  ContentWatch gradients_;   // as copied out in the last backward
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::unique_ptr<StagingRing> ring_;  // update="exact"'s; null where buckets keep their buffers
  std::shared_ptr<offload::UpdateQueue> queue_;  // last: its jobs finish before the rest goes
};

}  // namespace stowage::torch_offload
