// What an out-of-memory error tells the user (Note [OOM message]).
//
// Note [OOM message]
// The message opens as torch's own does, "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0
// has a total capacity of 79.11 GiB of which 10.12 MiB is free. ..." (CPU mode: "CPU out of
// memory. ... The simulated device has a total capacity of ..."), sizes written as torch writes
// them: the tools that recognise an OOM by its text (accelerate's find_executable_batch_size,
// the Trainer's auto_find_batch_size, Lightning, PyTorch's own tests) recognise stowage's. Then
// "stowage:" explains, naming the one cause that applies:
//   - the request is larger than the device, or than the cap;
//   - under a cap (the allocator's limit or memory_fraction, torch's per-process fraction) the
//     cap comes first, and when the device had room the cap is what refused;
//   - the device reports room but refused (a driver, address-space or mapping-limit failure);
//   - fragmentation, only when the free bytes of ONE kind would hold the request and their pieces
//     do not: stowage's cache has enough free, but no free block this request can use (its size
//     class and stream) is large enough;
//   - otherwise live blocks hold the memory: neither the device's free memory nor stowage's cache
//     holds the request alone (bytes of the two kinds do not add up to one block).
// Fragmentation is defined in the message itself: 1 - the largest free block the request could
// use / the cache's free bytes.
#pragma once

#include <cstddef>
#include <string>

#include "device/backend.hpp"

namespace stowage {

struct OomReport {
  int device = 0;
  std::string kind = "CUDA";         // as torch names it (MemoryNames::kind)
  std::string holder = "GPU 0";      // MemoryNames::holder
  std::size_t requested = 0;         // the caller's bytes
  std::size_t rounded = 0;           // the block size stowage needed
  Stream stream;
  std::size_t allocated = 0;             // live blocks
  std::size_t reserved = 0;              // segments held from the device
  std::size_t reserved_unallocated = 0;  // reserved - allocated (cached or waiting on streams)
  std::size_t largest_free_block = 0;    // of the shared pool, any size class and stream
  std::size_t largest_usable_block = 0;  // of those this request may take (its class and stream)
  std::size_t device_total = 0;          // of that memory
  std::size_t device_free = 0;
  std::size_t limit = 0;  // the cap in force: the device total when nothing smaller caps it
  std::string cap;        // where the cap comes from (MemoryLimit::bound_name)
  double fragmentation = 0;  // 1 - largest_usable_block / reserved_unallocated
  std::string message;

  // Fills fragmentation and message from the figures above.
  void describe();
};

// torch's size format (c10's format_size): "1024 bytes", "672.00 KiB", "20.00 MiB", "1.50 GiB".
std::string format_size_as_torch(std::size_t bytes);

}  // namespace stowage
