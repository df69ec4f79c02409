// CPU mode: stowage as torch's CPU allocator, over a simulated device of a chosen capacity.
//
// Every CPU tensor allocated while CPU mode is on comes from a CachingAllocator over a
// synchronous HostBackend: real PyTorch models run on a capped device, and OOMs, statistics,
// history and snapshots behave as they would on a GPU. The c10::Allocator contract is kept:
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

#include "allocator/caching_allocator.hpp"
#include "python/bindings/torch/stack_table.hpp"

namespace stowage::torch_cpu {

// Installs stowage as torch's CPU allocator. Throws LogicError on a configuration conflict.
void enable(std::size_t capacity_bytes, const std::string& config);
// Gives torch back the allocator it had before enable(). No-op when not enabled.
void disable();
bool is_enabled();
// The instance, or nullptr before the first enable().
CachingAllocator* allocator();
// The stacks behind the allocator's history (never destroyed).
StackTable& stack_table();

}  // namespace stowage::torch_cpu
