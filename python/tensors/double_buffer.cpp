#include "python/tensors/double_buffer.hpp"

#include <utility>

#include "base/errors.hpp"

namespace stowage::torch_offload {

DoubleBuffer::DoubleBuffer(HostStateStore& store, std::shared_ptr<void> block, at::Tensor current)
    : block_(std::move(block)), current_(std::move(current)) {
  STOWAGE_CHECK(current_.defined() && current_.dim() == 1 && current_.is_contiguous() &&
                    current_.storage_offset() == 0,
                "a double buffer is made over a flat tensor of its own storage");
  spare_block_ = store.allocate(current_.nbytes());
  spare_ = HostStateStore::tensor_over(spare_block_, current_.numel(), current_.scalar_type());
  spare_.zero_();
}

void DoubleBuffer::swap() { swap_memory(current_, spare_); }

void swap_memory(const at::Tensor& a, const at::Tensor& b) {
  c10::StorageImpl* first = a.storage().unsafeGetStorageImpl();
  c10::StorageImpl* second = b.storage().unsafeGetStorageImpl();
  STOWAGE_CHECK(first->nbytes() == second->nbytes(), "swapping the memory of storages of ", first->nbytes(), " and ",
                second->nbytes(), " bytes");
  at::DataPtr taken = first->set_data_ptr(at::DataPtr(nullptr, first->device()));
  first->set_data_ptr(second->set_data_ptr(std::move(taken)));
}

}  // namespace stowage::torch_offload
