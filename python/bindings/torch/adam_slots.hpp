// AdamSlots: the offloaded optimizer's parameters in host memory and what happens to them in a
// step, for stowage.offload.Adam (which observes torch and calls in here). It owns the host
// buckets (host_bucket.hpp, laid out by offload/adam_buckets.hpp), each offloaded parameter's
// views in them (a "slot": master, moments, step count), the step's bookkeeping
// (offload/slot_book.hpp, Note [Offloaded optimizer semantics]), the copies on the offload engine
// (optimizer_transfers.hpp), the queue the updates run on (offload/update_queue.hpp) and two
// content watches (content_watch.hpp): the parameters as last written back or taken, and the
// gradients as each was copied out, so that a change made by anyone (a hook, a write that leaves
// versions alone, a tensor put in its place) is seen.
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
// Contract: one thread at a time (the optimizer's, under its lock). finish(), write_back(),
// roll_back(), first_changed_arrival(), first_changed_gradient() and synchronize() wait for the
// host update or the copies and may be called without the GIL; name_of is called only from the
// others. Each call either does all it says or, when it throws, leaves the book as it was or
// resumable by calling it again (Note [Whole steps]). The destructor waits for the copies still
// using the host buffers.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "offload/adam_buckets.hpp"
#include "offload/slot_book.hpp"
#include "offload/update_queue.hpp"
#include "python/bindings/torch/content_watch.hpp"
#include "python/bindings/torch/host_bucket.hpp"
#include "python/bindings/torch/host_state_store.hpp"
#include "python/bindings/torch/optimizer_transfers.hpp"

namespace stowage::torch_offload {

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

  AdamSlots(const c10::Device& device, std::string owner, offload::UpdateMode mode, const std::vector<int>& cpus,
            bool master_weights, std::int64_t bucket_numel, std::function<std::string(std::size_t)> name_of);
  ~AdamSlots();
  AdamSlots(const AdamSlots&) = delete;
  AdamSlots& operator=(const AdamSlots&) = delete;

  HostStateStore& store() noexcept { return *store_; }
  const offload::UpdateQueue& queue() const noexcept { return *queue_; }
  const offload::SlotBook& book() const noexcept { return book_; }
  offload::SlotBook& book_mutable() noexcept { return book_; }
  double watch_seconds() const noexcept { return parameters_.seconds() + gradients_.seconds(); }
  std::size_t size() const noexcept { return slots_.size(); }

  // --- joining: parameters `shards` of param groups `groups` (numbers the caller gives) ---
  // Host bytes their buckets would take (Note [Optimizer buckets]).
  std::int64_t host_bytes(const Tensors& shards, const Indices& groups, const std::vector<bool>& amsgrad) const;
  // Lays out their buckets; masters start from the shards. Returns, for each new slot in number
  // order, the position in `shards` of its parameter.
  Indices join(const Tensors& shards, const Indices& groups, const std::vector<bool>& amsgrad);
  std::size_t group_of(std::size_t bucket) const;
  SlotStates states(std::size_t slot) const;

  // --- gradients ---
  // Copies `slot`'s gradient out (its bytes' checksum taken as it leaves) and counts it: returns
  // the bucket made ready by it, -1 when it is not ready, kArrivedTwice (nothing done) when
  // in_backward already updated the bucket.
  static constexpr std::int64_t kArrivedTwice = -2;
  std::int64_t arrive(std::size_t slot, const at::Tensor& gradient, const at::Tensor& shard);
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

  // --- parameters written by someone else ---
  // The slots whose parameter's bytes changed since they were last written back or taken.
  Indices written(const Indices& slots, const Tensors& shards);
  // Those become the masters (and the outputs a delayed write-back sends); returns them.
  Indices take_written(const Indices& slots, const Tensors& shards);
  // The slots' parameters as they are now are the reference.
  void parameters_are(const Indices& slots, const Tensors& shards);

  // --- updates ---
  // Refuses (invalid_argument) options the host states cannot take (amsgrad turned on after
  // the states were made), before anything of a step is submitted.
  void check_options(const std::vector<GroupOptions>& groups) const;
  // in_backward: the provisional updates made with options other than their group's now (a
  // scheduler stepped, or lr set, between backward and step()).
  Indices outdated_updates(const std::vector<GroupOptions>& groups) const;
  // Queues the bucket's update when it has gradients (the gradients scaled by `grad_scale`; its
  // step counts incremented now); returns the slots updated.
  Indices submit(std::size_t bucket, const GroupOptions& options, double grad_scale);
  // Waits for the bucket's update (Note [Bounded waits]) and rethrows what it threw.
  void finish(std::size_t bucket);
  void finish_pending();
  // Waits for the update and starts writing back its slots' parameters (`shards`, in the order
  // of book().updated_slots(bucket)).
  void write_back(std::size_t bucket, const Tensors& shards);
  // Check mode: after the copies, the first slot whose parameter is not bit for bit what the
  // update made (-1: none).
  std::int64_t first_changed_arrival(const Indices& slots, const Tensors& shards);
  // Undoes in_backward's provisional updates (all, or those of `buckets`): waits for them to
  // end, however they ended, and restores the states and step counts they began from. Returns
  // the slots whose step count is back to 0.
  Indices roll_back();
  Indices roll_back(const Indices& buckets);
  void reset_arrivals() noexcept { book_.reset_arrivals(); }
  // The step's updates stand; the arrivals go.
  void end_step();
  // A skipped step: nothing of it applied (pending updates stay).
  void discard_step();
  // delayed: this step's updates wait for the next step.
  void hold_pending() { book_.hold_pending(); }
  void clear_pending() noexcept { book_.clear_pending(); }
  Indices pending_slots() const;
  void written_back() { transfers_->written_back(); }
  void synchronize();

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
    std::size_t group = 0;
    std::optional<CopyMark> copied;    // this step's copies out
    std::optional<CopyMark> returned;  // the last write-back
    std::shared_ptr<offload::UpdateTicket> ticket;
    GroupOptions options;  // its update's, while it has one
  };

  std::vector<offload::BucketPlan> plan(const Tensors& shards, const Indices& groups) const;
  std::string where() const { return "stowage.offload." + owner_; }
  void copy_out(std::size_t slot, const at::Tensor& shard);
  void clear_update(std::size_t bucket);
  // Waits until the bucket's update has ended (done or thrown), without taking its outcome.
  void wait_ended(std::size_t bucket);
  void check_options(const Bucket& bucket, const GroupOptions& options) const;

  c10::Device device_;
  std::string owner_;
  bool master_weights_;
  std::int64_t bucket_numel_;
  std::function<std::string(std::size_t)> name_of_;
  offload::SlotBook book_;
  std::unique_ptr<HostStateStore> store_;
  std::unique_ptr<OptimizerTransfers> transfers_;
  ContentWatch parameters_;  // as last written back (or taken)
  ContentWatch gradients_;   // as copied out in the last backward
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::shared_ptr<offload::UpdateQueue> queue_;  // last: its jobs finish before the rest goes
};

}  // namespace stowage::torch_offload
