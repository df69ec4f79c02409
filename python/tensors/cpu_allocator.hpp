// CPU mode: stowage as torch's CPU allocator, over a simulated device of a chosen capacity.
//
// Every CPU tensor allocated while CPU mode is on comes from a CachingAllocator over a
// HostBackend: real PyTorch models run on a capped device, and OOMs, statistics, history and
// snapshots behave as they would on a GPU. torch's CPU ops run on the calling thread; the
// simulated device's streams run on threads of their own (the offload engine's copies overlap
// the compute, at a chosen bandwidth), stopped and restarted around fork() so DataLoader
// workers inherit working streams. The c10::Allocator contract is kept:
// a DataPtr's context is its data pointer and raw_deleter() is set (oneDNN relies on both).
// Out of memory raises c10::OutOfMemoryError, which Python sees as torch.OutOfMemoryError, with
// stowage's explaining message.
//
// Contract: one process-wide instance, created by enable() and never destroyed: tensors it
// allocated may outlive disable() and are still freed through it. enable() after disable()
// reinstalls the same instance (its capacity and configuration must match or it throws).
// Thread-safe. Survives fork(): the child inherits a consistent allocator.
#pragma once

#include <cstddef>
#include <string>

#include <c10/core/Storage.h>

#include "allocator/caching_allocator.hpp"
#include "device/host/host_backend.hpp"
#include "python/tensors/stack_table.hpp"

namespace stowage::torch_cpu {

struct CpuModeOptions {
  std::size_t capacity_bytes = 0;
  std::string config;                // the allocator's key:value configuration
  double copy_bytes_per_second = 0;  // the simulated link's bandwidth; 0: memcpy speed
  std::size_t pinned_bytes = 0;      // host memory the device will pin (ulimit -l); 0: any
  bool operator==(const CpuModeOptions&) const = default;
};

// Installs stowage as torch's CPU allocator. Throws LogicError on a configuration conflict.
void enable(const CpuModeOptions& options);
// Gives torch back the allocator it had before enable(). No-op when not enabled.
void disable();
bool is_enabled();
// Whether CPU mode allocated `storage` (a tensor made before enable(), or from numpy, was not).
bool owns(const c10::Storage& storage);
// The instance, or nullptr before the first enable().
CachingAllocator* allocator();
// The simulated device under it, or nullptr before the first enable().
HostBackend* backend();
// The stacks behind the allocator's history (never destroyed).
StackTable& stack_table();

}  // namespace stowage::torch_cpu
