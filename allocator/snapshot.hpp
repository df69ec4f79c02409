// A picture of the allocator's memory, in the shape of PyTorch's memory snapshot: segments with
// their blocks and states, and the history's events. Plain values; the Python layer turns them
// into torch's dict (segments, device_traces).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/device/backend.hpp"
#include "allocator/block.hpp"
#include "allocator/history.hpp"
#include "allocator/private_pool.hpp"
#include "allocator/size_policy.hpp"

namespace stowage {

struct BlockSnapshot {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;  // 0 for free blocks
  BlockState state = BlockState::kFree;  // active_allocated, active_pending_free, inactive
  std::uint64_t context = 0;
};

struct SegmentSnapshot {
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;  // allocated blocks
  std::size_t active_size = 0;     // allocated and pending-free blocks
  std::size_t requested_size = 0;
  Stream stream;
  Pool pool = Pool::kSmall;
  bool is_expandable = false;
  PoolId owner{0, 0};  // the private pool it belongs to; (0, 0): the shared pools
  std::uint64_t context = 0;
  std::vector<BlockSnapshot> blocks;  // address order, tiling the segment
};

struct AllocatorSnapshot {
  int device = 0;
  std::vector<SegmentSnapshot> segments;  // address order
  std::vector<TraceEntry> trace;          // oldest first
};

}  // namespace stowage
