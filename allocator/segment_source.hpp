// SegmentSource: memory in whole segments (from the device, like cudaMalloc: PyTorch's design;
// or from another SegmentMemory, segment_memory.hpp).
//
// A request the cache cannot serve gets a segment of its own, sized by its SegmentMemory (for the
// device, Note [Rounding] in size_policy.hpp): the preferred size, else the smallest that holds
// the block when the memory or the limit refuses that. A segment goes back to the device only when wholly free: on
// empty_cache, before a retry, and under Note [Reserve budget] before a new one would take
// reserved memory beyond the budget. It serves the shared pool where the device has no virtual
// memory (or virtual_memory:off), and private pools always (their memory must never move).
//
// Contract: called under the allocator's lock; see memory_source.hpp.
#pragma once

#include <cstddef>
#include <functional>

#include "allocator/memory_source.hpp"

namespace stowage {

class SegmentSource final : public MemorySource {
 public:
  // Segments of max_split_size or more count as oversize in the statistics.
  explicit SegmentSource(const SourceParts& parts);

  Block* grow(const GrowRequest& request) override { return allocate(shared_, request); }
  Block* grow_again(const GrowRequest& request) override;
  bool release_cached() override;
  bool splits_fresh_blocks() const noexcept override { return false; }
  bool spares_whole_segments() const noexcept override { return !budget_.unbounded(); }

  // A new segment of `pool` holding a block for the request: its one free block, out of every
  // index; nullptr when the device or the limit refuses.
  Block* allocate(Pool& pool, const GrowRequest& request);
  // Returns the wholly free segments that `which` picks; true if any went back. A segment the
  // device refuses stays, logged.
  bool release_free(const std::function<bool(const Segment&)>& which);

 private:
  // Note [Reserve budget]: before a new segment of `size` takes reserved memory beyond the
  // budget, the shared pool's wholly free segments go back.
  void make_room(std::size_t size, std::size_t rounded);
  void release(Segment& segment);

  SegmentMemory& memory_;
  BlockCache& cache_;
  DeviceStats& stats_;
  TraceRecorder& trace_;
  const MemoryLimit& limit_;
  ReserveBudget& budget_;
  Pool& shared_;
  const std::size_t max_split_size_;
};

}  // namespace stowage
