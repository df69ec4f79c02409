// HostStateStore: host memory for the offloaded optimizer's states and staging buffers, as
// torch CPU tensors.
//
// For a CUDA device (or CPU mode's simulated device) the memory comes from that device's pinned
// host pool, the one its offload engine's activation pager uses (offload_engines.hpp): page-locked
// on the NUMA nodes nearest the GPU, so the gradient and parameter copies run at the link's speed,
// and pageable with one warning when the host refuses to pin (PinnedSegments). One pool per device
// means one host-memory limit, one placement and one set of statistics (stowage.memory_stats()'s
// offload.pinned.* keys count the states too). The states are the pool's resident blocks
// (allocate_resident): they live as long as the optimizer, so they sit in segments of their own,
// never in the activations' arena, which still settles between steps while they are held (Note
// [One pinned arena]); a segment goes back to the host once its last state is freed. For a plain
// CPU device there is nothing to pin for, and the tensors are torch's ordinary CPU tensors.
//
// The pool's limit caps the states with everything else the pool holds. stats() reports the
// store's own allocated bytes (the blocks it handed out and that are still held), the pool's
// resident segments as reserved bytes, and the rest (peaks, pinned and pageable bytes) as the
// pool's.
//
// Contract: thread-safe. Each tensor keeps the store's byte count alive (its deleter holds a
// reference), so tensors may outlive the store; the pool is its engine's, and engines are never
// destroyed. The caller makes sure no copy still uses a tensor's memory when the tensor is freed
// (the optimizer waits for its copies first): its block goes back without waiting for a stream.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "offload/pinned_host_pool.hpp"

namespace stowage::torch_offload {

class HostStateStore {
 public:
  // Host memory for optimizer states of parameters on `device`.
  explicit HostStateStore(const c10::Device& device);

  // A contiguous 1-D tensor of `numel` elements, uninitialised.
  at::Tensor empty(std::int64_t numel, at::ScalarType dtype);
  // `bytes` of host memory, freed when the last holder lets go (holders need no GIL).
  std::shared_ptr<void> allocate(std::size_t bytes);
  // A 1-D tensor of `numel` elements over `block`, holding it.
  static at::Tensor tensor_over(const std::shared_ptr<void>& block, std::int64_t numel, at::ScalarType dtype);

  // The bytes of the store's blocks still held (no lock taken).
  std::int64_t allocated_bytes() const noexcept { return held_->load(); }
  PinnedHostPoolStats stats() const;
  std::string placement() const;

 private:
  PinnedHostPool* pool_ = nullptr;  // the engine's; null for a plain CPU device
  // The bytes of the store's blocks still held, shared with their deleters.
  std::shared_ptr<std::atomic<std::int64_t>> held_ = std::make_shared<std::atomic<std::int64_t>>(0);
};

}  // namespace stowage::torch_offload
