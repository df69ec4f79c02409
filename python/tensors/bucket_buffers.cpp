#include "python/tensors/bucket_buffers.hpp"

#include "base/errors.hpp"

namespace stowage::torch_offload {

BucketBuffers::BucketBuffers(HostStateStore& store, const HostBucket& host, int grad_buffers, bool provisional) {
  STOWAGE_CHECK(grad_buffers >= 1, "a bucket needs a gradient buffer");
  const auto make = [&](at::ScalarType type) {
    std::shared_ptr<void> block = store.allocate(static_cast<std::size_t>(host.numel()) * c10::elementSize(type));
    blocks_.push_back(block);
    return HostStateStore::tensor_over(block, host.numel(), type);
  };
  if (host.master().defined()) {
    parameters_ = host.master();
    output_ = make(host.dtype());
  } else {
    parameters_ = make(host.state_type());
    if (provisional) {
      parameters_spare_ = std::make_unique<DoubleBuffer>(store, blocks_.back(), parameters_);
      blocks_.push_back(parameters_spare_->blocks().back());
    }
  }
  for (int i = 0; i < grad_buffers; ++i) gradients_.push_back(make(host.dtype()));
}

UpdateBuffers BucketBuffers::for_update(int grad_buffer, std::vector<CopyMark> waits) {
  STOWAGE_CHECK(grad_buffer >= 0 && static_cast<std::size_t>(grad_buffer) < gradients_.size(), "no gradient buffer ",
                grad_buffer);
  UpdateBuffers buffers;
  buffers.parameters = parameters_.data_ptr();
  buffers.gradients = gradients_[static_cast<std::size_t>(grad_buffer)].const_data_ptr();
  if (output_.defined()) buffers.output = output_.data_ptr();
  buffers.parameters_spare = parameters_spare_.get();
  buffers.held = blocks_;  // (own masters: the HostBucket's job holds them)
  buffers.waits = std::move(waits);
  return buffers;
}

}  // namespace stowage::torch_offload
