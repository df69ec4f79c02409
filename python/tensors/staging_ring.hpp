// StagingRing: the few host buffers update="exact" streams every bucket through at step() (Note
// [Staged buckets] in offload/adam_buckets.hpp). Each of its kStagingSlots slots holds one
// bucket's parameters and gradients, copied in from the device as they are at step(); the update
// reads them there (and updates the parameters in place, or writes its output there with fp32
// masters of narrower parameters) and the parameters are written back from there. It has
// min(kStagingSlots, buckets) slots (one bucket needs one); a step's bucket k takes slot k modulo
// their count, and a slot is handed out again only once its last write-back has finished
// (returned()), so no copy writes a buffer still being read. Every slot is sized for the largest
// bucket: the ring's bytes do not grow with the bucket count past kStagingSlots.
//
// Contract: not thread-safe (its AdamSlots' thread: Note [Overlapped steps]). The memory lives as
// long as this and every update holding it (Slot::held()); reserve() only while no copy uses the
// ring (it waits for the write-backs first).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "offload/adam_buckets.hpp"
#include "python/tensors/host_state_store.hpp"
#include "python/tensors/optimizer_transfers.hpp"

namespace stowage::torch_offload {

class StagingRing {
 public:
  explicit StagingRing(HostStateStore& store) : store_(&store) {}
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // One slot: a bucket's parameters and gradients, `capacity` bytes each.
  struct Slot {
    std::shared_ptr<void> parameters, gradients;
    std::optional<CopyMark> returned;  // the last write-back from it
    // A flat tensor of `numel` elements of `dtype` over the parameters' or the gradients' buffer.
    at::Tensor parameters_as(std::int64_t numel, at::ScalarType dtype) const;
    at::Tensor gradients_as(std::int64_t numel, at::ScalarType dtype) const;
  };

  // The bytes the ring would add to hold `buckets` buckets of at most `bytes` of parameters each
  // (and as many of gradients).
  std::int64_t growth_for(std::int64_t bytes, std::size_t buckets) const;
  // Grows the ring to hold `buckets` buckets of at most `bytes` of parameters each (buckets joined),
  // once the write-backs from it have finished.
  void reserve(std::int64_t bytes, std::size_t buckets);
  std::size_t slot_count() const noexcept { return slots_.size(); }
  // The slot of a step's `index`th bucket, once its last write-back has finished.
  Slot& take(std::size_t index);
  // The write-back from the slot of the `index`th bucket (nullopt: done already).
  void returned(std::size_t index, std::optional<CopyMark> mark);
  // The host bytes its buffers hold.
  std::int64_t bytes() const noexcept { return bytes_; }

 private:
  void wait_returned(Slot& slot);

  HostStateStore* store_;
  std::int64_t capacity_ = 0;  // bytes of each buffer of each slot
  std::int64_t bytes_ = 0;
  std::vector<Slot> slots_;
};

}  // namespace stowage::torch_offload
