// MemorySource: where a caching allocator's memory comes from when no cached block fits, and
// where it goes when the cache is emptied.
//
// Two sources exist: SegmentSource (whole segments, like cudaMalloc: segment_source.hpp) and
// PagedSource (pages mapped into reserved address space: paged_source.hpp). The allocator asks
// its source in the order of Note [Miss path] (caching_allocator.hpp): grow(), then, after
// pending frees have completed, grow_again(); release_cached() gives back what the cache holds.
//
// Contract: called under the allocator's lock. A source records the segments it makes in the
// allocator's BlockCache, counts them in the statistics, and never throws for want of memory:
// an empty result says the device or the limit refused.
#pragma once

#include <cstddef>
#include <cstdint>

#include "allocator/block.hpp"
#include "allocator/block_cache.hpp"
#include "allocator/memory_limit.hpp"
#include "allocator/pool.hpp"
#include "allocator/reserve_budget.hpp"
#include "allocator/segment_memory.hpp"
#include "allocator/size_policy.hpp"
#include "allocator/stats.hpp"
#include "allocator/trace_recorder.hpp"
#include "device/backend.hpp"

namespace stowage {

// A request the cache could not serve.
struct GrowRequest {
  SizeClass size_class = SizeClass::kSmall;
  Stream stream;
  std::size_t rounded = 0;  // the block size needed (Note [Rounding])
  std::uint64_t context = 0;
  // Requests are being routed to a private pool (a CUDA graph capture, or a MemPool): the
  // source may neither wait for the device nor give memory back (Note [Private pools] in
  // private_pools.hpp).
  bool capturing = false;
};

// What a memory source works with: the device, and the parts of its allocator it records into
// (all owned by the allocator and guarded by its lock).
struct SourceParts {
  DeviceBackend& backend;
  SegmentMemory& segments;  // what the segment path's segments are made of
  BlockCache& cache;
  DeviceStats& stats;
  TraceRecorder& trace;
  const MemoryLimit& limit;
  ReserveBudget& budget;
  Pool& shared;                // the pool the source serves
  std::size_t max_split_size;  // AllocatorConfig::max_split_size
  double move_pages_above;     // AllocatorConfig::move_pages_above
};

class MemorySource {
 public:
  virtual ~MemorySource() = default;

  // A free block of at least request.rounded bytes for the shared pool, made from memory new to
  // the cache (or, on the paged path, moved within it), out of every index; nullptr when none
  // can be had now.
  virtual Block* grow(const GrowRequest& request) = 0;
  // The second attempt, once pending frees have completed: what grow() could not do then.
  virtual Block* grow_again(const GrowRequest& request) = 0;
  // Gives the shared pool's cached memory back to the device; true if any went back.
  virtual bool release_cached() = 0;
  // Whether a block grow() made may have a remainder split off even for an oversize request
  // (Note [Splitting] in size_policy.hpp).
  virtual bool splits_fresh_blocks() const noexcept = 0;
  // Whether a wholly free cached segment is spared from a much smaller request while the device
  // can give that request memory of its own (Note [Splitting]).
  virtual bool spares_whole_segments() const noexcept = 0;
};

}  // namespace stowage
