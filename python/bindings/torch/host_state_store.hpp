// HostStateStore: host memory for the offloaded optimizer's states and staging buffers, as
// torch CPU tensors.
//
// For a CUDA device (or CPU mode's simulated device) the memory comes from a pinned host pool of
// the store's own over that device's backend: page-locked on the NUMA nodes nearest the GPU, so
// the gradient and parameter copies run at the link's speed, and pageable with one warning when
// the host refuses to pin (PinnedSegments). The optimizer's pool is not the activation pager's:
// its blocks live as long as the optimizer, and the pager's pool settles into one arena only
// when it is idle (Note [One pinned arena]). For a plain CPU device there is nothing to pin
// for, and the tensors are torch's ordinary CPU tensors.
//
// Contract: thread-safe. Each tensor keeps the pool alive (its deleter holds a reference), so
// tensors may outlive the store. The caller makes sure no copy still uses a tensor's memory
// when the tensor is freed (the optimizer waits for its copies first).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "offload/pinned_host_pool.hpp"

namespace stowage::torch_offload {

class HostStateStore {
 public:
  // Host memory for optimizer states of parameters on `device`, at most `limit_bytes` of it
  // (0: the host's physical memory).
  HostStateStore(const c10::Device& device, std::size_t limit_bytes);

  // A contiguous 1-D tensor of `numel` elements, uninitialised.
  at::Tensor empty(std::int64_t numel, at::ScalarType dtype);
  // `bytes` of host memory, freed when the last holder lets go (holders need no GIL).
  std::shared_ptr<void> allocate(std::size_t bytes);
  // A 1-D tensor of `numel` elements over `block`, holding it.
  static at::Tensor tensor_over(const std::shared_ptr<void>& block, std::int64_t numel, at::ScalarType dtype);

  PinnedHostPoolStats stats() const;
  std::string placement() const;

 private:
  std::shared_ptr<PinnedHostPool> pool_;  // null for a plain CPU device
};

}  // namespace stowage::torch_offload
