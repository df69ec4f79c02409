// A picture of the allocator's memory, in the shape of PyTorch's memory snapshot: segments with
// their blocks and states, and the history's events. Plain values; the Python layer turns them
// into torch's dict (segments, device_traces).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "allocator/block.hpp"
#include "allocator/history.hpp"
#include "allocator/pool.hpp"
#include "allocator/size_policy.hpp"
#include "device/backend.hpp"

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
  SizeClass size_class = SizeClass::kSmall;
  bool is_expandable = false;
  PoolId owner = kSharedPoolId;  // the private pool it belongs to; (0, 0): the shared pool
  std::uint64_t context = 0;
  std::vector<BlockSnapshot> blocks;  // address order, tiling the segment
};

struct AllocatorSnapshot {
  int device = 0;
  std::vector<SegmentSnapshot> segments;  // address order
  std::vector<TraceEntry> trace;          // oldest first
  std::uint64_t trace_recorded = 0;       // History::recorded() when the snapshot was taken
};

// Appends what a snapshot shows of `segment`: a whole segment as one SegmentSnapshot; paged
// memory as one expandable SegmentSnapshot per run of mapped pages, as torch reports an
// expandable segment's mapped part (runs start and end at holes, which are page-aligned, so
// blocks tile each run).
void append_snapshot(const Segment& segment, AllocatorSnapshot& out);

// The device memory range `block` (allocated) lies in: its run of mapped blocks, which for a
// whole segment is the segment.
std::pair<void*, std::size_t> mapped_range(const Block& block);

}  // namespace stowage
