#include "python/tensors/staging_ring.hpp"

#include <algorithm>

#include "base/bounded_wait.hpp"
#include "base/errors.hpp"

namespace stowage::torch_offload {

StagingRing::~StagingRing() {
  try {
    for (Slot& slot : slots_) wait_returned(slot);  // before the buffers a copy reads go
  } catch (...) {  // stuck or interrupted: what a copy may still read is leaked, never freed early
    for (Slot& slot : slots_) {
      new std::shared_ptr<void>(std::move(slot.parameters));
      new std::shared_ptr<void>(std::move(slot.gradients));
    }
  }
}

at::Tensor StagingRing::Slot::parameters_as(std::int64_t numel, at::ScalarType dtype) const {
  return HostStateStore::tensor_over(parameters, numel, dtype);
}

at::Tensor StagingRing::Slot::gradients_as(std::int64_t numel, at::ScalarType dtype) const {
  return HostStateStore::tensor_over(gradients, numel, dtype);
}

namespace {

std::size_t slots_for(std::size_t buckets) { return std::min(offload::kStagingSlots, std::max<std::size_t>(buckets, 1)); }

}  // namespace

std::int64_t StagingRing::growth_for(std::int64_t bytes, std::size_t buckets) const {
  const std::int64_t wanted = 2 * std::max(bytes, capacity_) * static_cast<std::int64_t>(slots_for(buckets));
  const std::int64_t now = 2 * capacity_ * static_cast<std::int64_t>(slots_.size());
  return std::max<std::int64_t>(wanted - now, 0);
}

void StagingRing::reserve(std::int64_t bytes, std::size_t buckets) {
  const std::size_t count = std::max(slots_for(buckets), slots_.size());
  if (bytes <= capacity_ && count == slots_.size()) return;
  const std::int64_t before = store_->allocated_bytes();
  const std::int64_t capacity = std::max(bytes, capacity_);
  for (Slot& slot : slots_) wait_returned(slot);  // (the update that read a slot finished before its write-back)
  slots_.resize(count);
  for (Slot& slot : slots_) {
    slot.parameters = store_->allocate(static_cast<std::size_t>(capacity));
    slot.gradients = store_->allocate(static_cast<std::size_t>(capacity));
  }
  capacity_ = capacity;
  bytes_ += store_->allocated_bytes() - before;  // (the old buffers went back)
}

void StagingRing::wait_returned(Slot& slot) {
  if (!slot.returned.has_value()) return;
  const CopyMark mark = *slot.returned;
  wait_until([&] { return mark.done(); }, {"a bucket's write-back from the staging ring", mark.bytes});
  slot.returned.reset();
}

StagingRing::Slot& StagingRing::take(std::size_t index) {
  Slot& slot = slots_[index % slots_.size()];
  STOWAGE_CHECK(slot.parameters != nullptr, "the staging ring has no room reserved");
  wait_returned(slot);
  return slot;
}

void StagingRing::returned(std::size_t index, std::optional<CopyMark> mark) {
  slots_[index % slots_.size()].returned = std::move(mark);
}

}  // namespace stowage::torch_offload
