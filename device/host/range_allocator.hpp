// First-fit allocation of offset ranges inside [0, total): the bookkeeping under HostBackend's
// device file and its segment region.
//
// Ranges are handed out lowest offset first; freed ranges coalesce with free neighbours.
// Contract: not thread-safe (HostBackend serialises calls under its memory lock); knows nothing
// of the memory the offsets stand for. Every size and offset is a multiple of the alignment.
// Invariant: free ranges and allocated ranges are disjoint and together cover [0, total).
#pragma once

#include <cstddef>
#include <map>
#include <optional>

namespace stowage {

class RangeAllocator {
 public:
  RangeAllocator(std::size_t total, std::size_t alignment);

  // The offset of a free range of `bytes` (a positive multiple of the alignment), or nullopt.
  std::optional<std::size_t> try_allocate(std::size_t bytes);
  // Returns an allocated range.
  void free(std::size_t offset, std::size_t bytes);
  // Extends the space to [0, new_total); the new tail is free.
  void grow(std::size_t new_total);

  std::size_t allocated_bytes() const noexcept { return allocated_bytes_; }
  std::size_t total() const noexcept { return total_; }
  std::size_t alignment() const noexcept { return alignment_; }

  // Throws InternalError if the free list is inconsistent with the allocated byte count.
  void check_invariants() const;

 private:
  std::size_t total_;
  std::size_t alignment_;
  std::size_t allocated_bytes_ = 0;
  std::map<std::size_t, std::size_t> free_ranges_;  // offset -> bytes; coalesced, disjoint
};

}  // namespace stowage
