// The process's stowage allocators for CUDA devices: one CachingAllocator per device, each over
// a CudaBackend, all with one configuration.
//
// Every way into stowage on a GPU goes through here, so a process has one allocator per device
// however it was installed: torch's allocator (stowage._torch, or a libtorch program through
// python/libtorch/cuda_allocator.hpp) and the plain C library (stowage_malloc / stowage_free, for torch's
// CUDAPluggableAllocator) share them, because this file lives in one shared library,
// libstowage.so, that all of them load.
//
// Contract: thread-safe. The configuration is fixed by the first configure() or the first
// allocator made, whichever comes first (the empty configuration by default). Allocators are
// made on first use and never destroyed: torch frees tensors during interpreter shutdown, after
// static destructors would have run.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "allocator/caching_allocator.hpp"

namespace stowage::cuda_allocators {

// Sets the configuration (the key:value,... syntax of AllocatorConfig). Once set, or once an
// allocator exists, a different configuration is a LogicError naming both.
void configure(const std::string& config);
// The configuration in force (normalised).
std::string configuration();
// Whether configure() was called or an allocator made (the configuration is then fixed).
bool configured();
// Device `device`'s allocator, made now if need be. Throws LogicError for a device that does
// not exist, BackendError when CUDA cannot open it.
CachingAllocator& get(int device);
// Device `device`'s allocator, or nullptr if none was made yet.
CachingAllocator* find(int device) noexcept;
// The allocator when exactly one has been made (the one-GPU case), else nullptr. Lock-free.
CachingAllocator* sole() noexcept;
// The allocator that handed out `ptr` (a live allocation), or nullptr.
CachingAllocator* owning(const void* ptr);
// Calls fn for every allocator made so far, in device order.
void for_each(const std::function<void(int device, CachingAllocator&)>& fn);
// Called with every allocator as it is made, before any other thread can reach it (and at once
// with those already made); under the registry's lock, so fn must not call into the registry.
void on_create(const std::function<void(int device, CachingAllocator&)>& fn);

}  // namespace stowage::cuda_allocators
