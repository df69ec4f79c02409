// Physical memory of the simulated device: offset ranges of one memfd (Note [Host physical memory]).
//
// Note [Host physical memory]
// HostBackend's physical handles must be mappable at several virtual addresses at once (that is
// what makes stitching real: two views of one handle see the same bytes), so they live in a
// file, not in anonymous memory. File descriptors are few, so all handles share one memfd and a
// handle is an offset range of it. The file is sparse: its size is address space, not RAM; pages
// cost memory only once touched, and freeing a range punches a hole so the RAM goes back at
// once. The file starts at kFileSlack times the device capacity and grows when its offsets are
// too fragmented for a request, so fragmentation never fails a creation (capacity is enforced
// by HostBackend, not here).
//
// Contract: not thread-safe (HostBackend serialises all calls under its memory lock). Owns the
// file descriptor. Ranges come from a RangeAllocator over the file (first fit, coalescing).
#pragma once

#include <cstddef>
#include <optional>

#include "device/host/range_allocator.hpp"

namespace stowage {

class HostPhysicalMemory {
 public:
  static constexpr std::size_t kFileSlack = 4;

  // capacity_bytes: the device capacity; alignment: every range's size and offset is a multiple.
  HostPhysicalMemory(std::size_t capacity_bytes, std::size_t alignment,
                     bool release_freed_memory);
  ~HostPhysicalMemory();
  HostPhysicalMemory(const HostPhysicalMemory&) = delete;
  HostPhysicalMemory& operator=(const HostPhysicalMemory&) = delete;

  int fd() const noexcept { return fd_; }

  // Returns the offset of a fresh zero-filled range of `bytes`, growing the file if needed;
  // nullopt only if the file cannot grow. bytes must be a positive multiple of the alignment.
  std::optional<std::size_t> try_allocate(std::size_t bytes);
  // Returns a range to the file and its RAM to the system. The range must be allocated.
  void free(std::size_t offset, std::size_t bytes) noexcept;

  std::size_t allocated_bytes() const noexcept { return ranges_.allocated_bytes(); }

  void check_invariants() const { ranges_.check_invariants(); }

 private:
  int fd_ = -1;
  RangeAllocator ranges_;
  bool release_freed_memory_;
};

}  // namespace stowage
