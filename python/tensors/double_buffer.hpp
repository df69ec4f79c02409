// DoubleBuffer: a flat host tensor with a spare of the same size and type, for updates written
// out of place (Note [Provisional updates out of place] in host_bucket.hpp). `current()` is the
// tensor everyone is handed, views of it included (torch's optimizer.state entries are views);
// the spare is the memory an update writes its results to. swap() makes the spare's bytes current
// by exchanging the memory behind the two tensors' storages (their data pointers): every tensor
// and view over the current storage, made before the swap or after, then reads the results, and
// the bytes that were current become the spare. No byte is copied.
//
// Contract: not thread-safe (the optimizer's thread); swap() only while nothing reads or writes
// either buffer through a pointer taken before it (no update running over them). Both blocks come
// from one store and live as long as any tensor over them or any holder of blocks().
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "python/tensors/host_state_store.hpp"

namespace stowage::torch_offload {

class DoubleBuffer {
 public:
  // `current`: a flat tensor over `block` (HostStateStore::tensor_over); the spare is allocated
  // from `store` and zeroed (its pages touched now, not in the first update).
  DoubleBuffer(HostStateStore& store, std::shared_ptr<void> block, at::Tensor current);

  const at::Tensor& current() const noexcept { return current_; }
  void* current_data() const { return current_.data_ptr(); }
  void* spare_data() const { return spare_.data_ptr(); }
  // The memory behind both, for an update to hold.
  std::vector<std::shared_ptr<void>> blocks() const { return {block_, spare_block_}; }
  std::int64_t bytes() const noexcept { return static_cast<std::int64_t>(current_.nbytes()); }
  void swap();

 private:
  std::shared_ptr<void> block_, spare_block_;
  at::Tensor current_, spare_;
};

// Exchanges the memory behind two tensors' storages of the same size (their data pointers), so
// that every tensor over either sees the other's bytes. LogicError for storages of other sizes.
void swap_memory(const at::Tensor& a, const at::Tensor& b);

}  // namespace stowage::torch_offload
