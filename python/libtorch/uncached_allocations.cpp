#include "python/libtorch/uncached_allocations.hpp"

namespace stowage::torch_cuda {

void* UncachedAllocations::allocate(DeviceBackend& backend, std::size_t bytes) {
  void* ptr = backend.try_allocate_segment(bytes);
  if (ptr == nullptr) return nullptr;
  try {
    std::lock_guard lock(mutex_);
    live_.emplace(ptr, &backend);
    live_count_.store(live_.size(), std::memory_order_release);
  } catch (...) {
    backend.free_segment(ptr);
    throw;
  }
  return ptr;
}

bool UncachedAllocations::free(void* ptr) {
  DeviceBackend* backend = nullptr;
  {
    std::lock_guard lock(mutex_);
    const auto found = live_.find(ptr);
    if (found == live_.end()) return false;
    backend = found->second;
    live_.erase(found);
    live_count_.store(live_.size(), std::memory_order_release);
  }
  backend->free_segment(ptr);  // without the lock: cudaFree waits for the device
  return true;
}

}  // namespace stowage::torch_cuda
