// Device memory served without the cache, while torch's caching is off.
//
// torch.cuda.caching_allocator_enable(False) makes torch's own allocator call cudaMalloc for every
// allocation and cudaFree when it is freed, counting neither in its statistics (a debugger such
// as compute-sanitizer then sees every buffer, and freed memory goes back at once). stowage does
// the same: these are those allocations, each a segment of its device's backend
// (try_allocate_segment), returned to it by free(). A tensor allocated while caching was off is
// freed here even after caching is back on, and the reverse, as in torch.
//
// Contract: thread-safe. Owns each allocation until free(); the backends must outlive it (the
// process's CUDA backends are never destroyed).
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <unordered_map>

#include "device/backend.hpp"

namespace stowage::torch_cuda {

class UncachedAllocations {
 public:
  // `bytes` (> 0) of `backend`'s memory; nullptr when the device has no room for them.
  void* allocate(DeviceBackend& backend, std::size_t bytes);
  // Returns `ptr` to its device when it is one of these allocations; false (and nothing done)
  // otherwise.
  bool free(void* ptr);
  // Whether any allocation is live (lock-free: the free path asks before looking one up).
  bool empty() const noexcept { return live_count_.load(std::memory_order_acquire) == 0; }

 private:
  std::mutex mutex_;  // guards live_
  std::unordered_map<void*, DeviceBackend*> live_;
  std::atomic<std::size_t> live_count_{0};
};

}  // namespace stowage::torch_cuda
