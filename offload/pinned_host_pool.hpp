// PinnedHostPool: a caching allocator for page-locked host memory, the offload engine's staging
// area for tensors offloaded from the device.
//
// It is the device allocator's own block machinery (CachingAllocator) over PinnedSegments:
// 512 B rounding, best fit, splitting and coalescing, and stream-ordered reuse, so a host block
// returns to the pool only once the copies that used it have completed (record_stream(block,
// copy stream) before free, as on the device). Pinning is costly (cudaHostRegister locks every
// page), so the step blocks' segments are kept until the pool is destroyed and never given back
// to make room (reserve_headroom:1); resident segments go back with their last block (below).
//
// Note [One pinned arena]
// Segments made during one step are as many as the first blocks that needed them; a later step
// whose blocks are the same bytes in another order or other sizes may not fit in them and would
// pin more. So at a step boundary (no step block allocated), settle() replaces the large step
// segments, when there are several, by one segment the size of the most the step blocks held
// at once since it last settled. Offloaded tensors are allocated during forward and freed
// during backward, so the next step allocates into one free range front to back and fits
// whenever its peak is no larger: no new pinning of large blocks once the longest step has run,
// and a footprint of that peak (tests/offload/pinned_host_pool_test.cpp). Blocks of up to 1 MiB
// are the allocator's small class, packed into 2 MiB segments of their own (Note [Rounding]),
// never into the arena: a shorter step whose tensors fall to that size (a GPT-2 medium's bf16
// activations at 128 tokens x 8) pins small segments once, up to the small class's peak, the first
// time it runs (measured on an H200 and in CPU mode: 6 segments, 12 MiB, after a 37-segment step).
//
// Resident blocks (allocate_resident: the offloaded optimizer's states, which live as long as
// the optimizer) share the pool's segments' source, so one device has one pinned pool: one
// host-memory limit counting both kinds, one NUMA placement, one set of statistics. They come
// from an allocator of their own over that source, so they sit in segments of their own, never
// in the arena (a long-lived block there would split its one free range, and the pool would never
// be idle), and settle() ignores them: a pool holding resident blocks settles whenever no
// step block is allocated. A resident segment goes back to the host as soon as its last block is
// freed (free_resident), as the optimizer's own pool did when the optimizer went: cached, it
// would hold host memory (and limit room) the steps' blocks cannot use.
//
// Contract: thread-safe (the allocators' locks; the segments' own). Out of host memory (the limit
// counts step and resident segments together), allocate() and allocate_resident() throw
// OutOfMemory naming pinned host memory; try_allocate() returns nullptr instead. A block goes back
// through the free of its kind: free() for allocate()'s, free_resident() for allocate_resident()'s.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "allocator/caching_allocator.hpp"
#include "device/backend.hpp"
#include "offload/pinned_segments.hpp"

namespace stowage {

struct PinnedHostPoolOptions {
  std::size_t limit_bytes = 0;  // host memory the pool may hold; 0: the host's physical memory
  std::string pci_bus_id;       // the GPU whose NUMA nodes the memory goes to; empty: anywhere
};

// Step and resident blocks together unless named resident.
struct PinnedHostPoolStats {
  std::int64_t allocated_bytes = 0;       // in blocks handed out
  // Since the pool was made: the step blocks' peak plus the resident blocks' (at least the most
  // held at once; exactly that when the resident blocks at their peak stayed through the steps').
  std::int64_t peak_allocated_bytes = 0;
  std::int64_t reserved_bytes = 0;        // in segments (pinned or pageable)
  std::int64_t peak_reserved_bytes = 0;   // the most held at once since the pool was made
  std::int64_t resident_allocated_bytes = 0;  // in resident blocks (allocate_resident)
  std::int64_t resident_reserved_bytes = 0;   // in their segments
  std::int64_t num_segments = 0;
  std::int64_t num_syncs = 0;  // waits for copies still using freed blocks
  std::int64_t num_settles = 0;  // times the large segments became one (Note [One pinned arena])
  PinnedSegmentStats segments;
};

class PinnedHostPool {
 public:
  PinnedHostPool(DeviceBackend& backend, PinnedHostPoolOptions options);

  // A host block of at least `bytes`, usable by copies on `stream`.
  void* allocate(std::size_t bytes, Stream stream);
  void* try_allocate(std::size_t bytes, Stream stream);
  // `stream` uses the block too: its free waits for that stream's work so far.
  void record_stream(void* ptr, Stream stream) { allocator_.record_stream(ptr, stream); }
  void free(void* ptr) noexcept { allocator_.free(ptr); }

  // A long-lived host block of at least `bytes` (Note [One pinned arena]), in segments apart from
  // the step blocks' and never in the arena. Its holder uses it from the host and from copies it
  // waits for before free_resident(), which returns its segment to the host once that segment
  // holds no other resident block.
  void* allocate_resident(std::size_t bytes);
  void free_resident(void* ptr) noexcept;
  // The size of a resident block (its bytes rounded as the allocator rounds them).
  std::size_t resident_block_size(const void* ptr) const { return resident_.block_size(ptr); }

  // Note [One pinned arena]: when no step block is allocated (resident blocks may be) and the
  // large step blocks live in more than one segment, waits for the copies still using freed
  // blocks and replaces those segments by one the size of the step blocks' peak since the last
  // settle, its free block on `stream` (where the pool's step blocks are allocated). Returns whether it replaced them. Call it between steps: it may wait
  // for the device.
  bool settle(Stream stream);

  PinnedHostPoolStats stats() const;
  std::string placement() const { return segments_.placement(); }
  void check_invariants() const {
    allocator_.check_invariants();
    resident_.check_invariants();
  }

 private:
  static AllocatorConfig pool_config();
  // Keeps the step blocks' peak of `stats` before settle() resets the allocator's.
  void note_peaks(const DeviceStats& stats);

  PinnedSegments segments_;
  CachingAllocator allocator_;  // the step blocks (allocate, free), settled into the arena
  CachingAllocator resident_;   // the resident blocks, in segments of their own
  mutable std::mutex settle_mutex_;  // guards the two below
  std::int64_t peak_allocated_ = 0;  // the step blocks' peak before the allocator's last reset
  std::int64_t num_settles_ = 0;
};

}  // namespace stowage
