// What an out-of-memory error tells the user (Note [OOM message]).
//
// Note [OOM message]
// "Out of memory" alone sends users guessing. The message gives every figure needed to tell the
// causes apart, and names the one that applies: the request is larger than the device (nothing
// helps but less memory per step); the device reports room but refused (a driver, address-space
// or mapping-limit failure, logged before); the memory is free but in pieces (fragmentation:
// largest free block < request <= reserved-but-unallocated); or stowage holds the memory in
// live blocks (free tensors, offload, recompute). Fragmentation is defined in the message itself as
// 1 - largest free block / reserved-but-unallocated: 0% when all cached memory is one block.
#pragma once

#include <cstddef>
#include <string>

#include "allocator/device/backend.hpp"

namespace stowage {

struct OomReport {
  int device = 0;
  std::string memory = "device 0";    // what ran out (SegmentMemory::name)
  std::size_t requested = 0;          // the caller's bytes
  std::size_t rounded = 0;            // the block size stowage needed
  Stream stream;
  std::size_t allocated = 0;          // live blocks
  std::size_t reserved = 0;           // segments held from the device
  std::size_t reserved_unallocated = 0;  // reserved - allocated (cached or waiting on streams)
  std::size_t largest_free_block = 0;
  std::size_t device_total = 0;       // of that memory
  std::size_t device_free = 0;
  std::size_t limit = 0;              // stowage's own limit, or the device total when none
  double fragmentation = 0;           // 1 - largest_free_block / reserved_unallocated
  std::string message;

  // Fills fragmentation and message from the figures above.
  void describe();
};

}  // namespace stowage
