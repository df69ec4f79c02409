// Segment memory of the simulated device: one reserved region of host address space that
// segments are carved from (Note [Host segments]).
//
// Note [Host segments]
// Each segment could be an mmap of its own, but then a segment freed and allocated again pays a
// page fault and a zeroed page for every 4 KiB it touches, and holds a kernel mapping. Instead
// the simulated device reserves one MAP_NORESERVE region (kRegionSlack times its capacity: it is
// address space, not RAM), asks for huge pages, and hands out first-fit page-aligned ranges of
// it. Pages once touched stay with the region, as device memory stays with a GPU, so reusing a
// range costs nothing (zeroing fresh pages is slow: about 0.5 GB/s in a small VM); first fit
// keeps the touched part near the peak of reserved memory, and never above the capacity times
// kRegionSlack. With release_freed_memory, freed ranges are returned to the kernel
// (MADV_DONTNEED) instead. Should the region ever be too fragmented for a request, the segment
// gets an mmap of its own rather than fail. As with cudaMalloc, a new segment's contents are
// undefined.
//
// Contract: not thread-safe (HostBackend serialises calls under its memory lock). Owns the
// region; the capacity is HostBackend's to enforce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

#include "device/host/range_allocator.hpp"

namespace stowage {

class HostSegmentMemory {
 public:
  static constexpr std::size_t kRegionSlack = 2;

  HostSegmentMemory(std::size_t capacity_bytes, bool release_freed_memory);
  ~HostSegmentMemory();
  HostSegmentMemory(const HostSegmentMemory&) = delete;
  HostSegmentMemory& operator=(const HostSegmentMemory&) = delete;

  // A range of at least `bytes`, or nullptr when the host has no address space left.
  void* try_allocate(std::size_t bytes);
  // Returns a range from try_allocate, with the size it was asked for.
  void free(void* ptr, std::size_t bytes);

  void check_invariants() const { ranges_.check_invariants(); }
  // Segments that did not fit the region and have mappings of their own.
  std::size_t overflow_count() const noexcept { return overflow_.size(); }

 private:
  std::size_t page_;
  bool release_freed_memory_;
  std::uintptr_t base_ = 0;
  RangeAllocator ranges_;
  std::map<std::uintptr_t, std::size_t> overflow_;  // base -> mapped length
};

}  // namespace stowage
