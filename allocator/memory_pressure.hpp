// What the allocator asks, when the device is full, before it gives up (Note [Miss path]), and
// before a request takes allocated memory past the allocated ceiling (Note [Allocated ceiling]).
//
// A MemoryPressureHandler can make room at a cost: the offloader, for instance, copies
// tensors to host memory and frees their device blocks. The allocator calls handlers only after
// the cheap steps failed (cached blocks, a new segment, releasing wholly free cached segments),
// without holding its lock, so a handler may call CachingAllocator::free. Handlers are called in
// registration order until the request fits.
//
// Contract: relieve_pressure is called from the thread whose malloc missed, never while requests
// are routed to a private pool (Note [Private pools]); it must not throw and must not allocate
// through the same allocator.
#pragma once

#include <cstddef>

#include "device/backend.hpp"

namespace stowage {

class MemoryPressureHandler {
 public:
  virtual ~MemoryPressureHandler() = default;
  // `bytes` more are needed for a request on `stream`. Free what can be freed (through the
  // allocator's free) and return how many bytes were freed; 0 when there was nothing to give.
  virtual std::size_t relieve_pressure(std::size_t bytes, Stream stream) noexcept = 0;
};

}  // namespace stowage
