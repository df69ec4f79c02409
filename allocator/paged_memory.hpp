// PagedMemory: address reservations of the device's virtual memory, their page tables, and the
// calls that put physical pages under them and take them away (cuMemAddressReserve, cuMemCreate,
// cuMemMap, cuMemSetAccess, cuMemUnmap).
//
// A reservation is a segment of the BlockCache whose page table (block.hpp) says which of its
// pages are mapped; address space with no pages under it forms holes. adopt() turns pages just
// mapped at the start of a hole into cached memory, joined to the free mapped block before it;
// unmap() does the reverse for whole pages of a free mapped block. This is mechanism only: which
// hole to map, and where pages come from, is the policy above it (paged_source.hpp,
// page_stitcher.hpp, learned_placement.hpp).
//
// Failures: a device that refuses to map leaves what it mapped undone where it can; a range that
// can be neither unmapped nor made accessible is set aside ("lost") and kept out of use, and
// every release tries to unmap it again. Reserved bytes count mapped pages; num_device_alloc /
// num_device_free count pages created and released (stats.hpp).
//
// Contract: not thread-safe (the allocator's lock guards it). Owns the page tables and the
// reservations' address space; the BlockCache owns their segments and blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "allocator/block_cache.hpp"
#include "allocator/pool.hpp"

namespace stowage {

class PagedMemory {
 public:
  PagedMemory(DeviceBackend& backend, BlockCache& cache, DeviceStats& stats,
              TraceRecorder& trace);
  PagedMemory(const PagedMemory&) = delete;
  PagedMemory& operator=(const PagedMemory&) = delete;

  // The device's page (its virtual-memory granularity).
  std::size_t page() const noexcept { return page_; }

  // Reserves `bytes` (a multiple of the page) of address space for `pool`'s blocks of
  // `size_class` on `stream`: a segment that is one hole, indexed. nullptr (logged) when the
  // device refuses; throws, with nothing kept, when the bookkeeping cannot be made.
  Block* reserve(Pool& pool, SizeClass size_class, Stream stream, std::size_t bytes,
                 std::uint64_t context);
  // Returns the reservations of `pool` with nothing mapped; true if any went back.
  bool release_empty_reservations(const Pool& pool);
  // The streams that have a reservation.
  const std::vector<Stream>& streams() const noexcept { return streams_; }

  // Creates one page of physical memory into `out`; false when the device has none.
  bool create_page(std::vector<PhysicalHandle>& out);
  // Releases the handles (their memory returns once unmapped) and clears the vector.
  void release_pages(std::vector<PhysicalHandle>& handles);
  // Maps `handles` at `start` and makes them accessible. On failure, undoes what it can: the
  // handles that stay mapped (not undone) remain in `handles`, the rest are released; returns
  // false.
  bool map(std::uintptr_t start, std::vector<PhysicalHandle>& handles);
  // Records `handles`, just mapped and made accessible at the start of `hole`, and makes them
  // cache joined to the free mapped block before the hole; returns that block (indexed).
  Block* adopt(Block* hole, const std::vector<PhysicalHandle>& handles, std::uint64_t context);
  // Unmaps the pages [first, last) of free mapped block `block` (page-aligned, inside it) and
  // appends their handles to `out`; false (and nothing changed) if the device refused.
  bool unmap(Block* block, std::uintptr_t first, std::uintptr_t last,
             std::vector<PhysicalHandle>& out);

  // True when a range set aside after a failed map lies inside the hole.
  bool overlaps_lost_range(const Block& hole) const noexcept;
  // The pages of `hole` from its start before the first range set aside inside it (all of them
  // when none is).
  std::size_t pages_before_lost_range(const Block& hole) const noexcept;
  // Tries again to unmap the ranges set aside.
  void retry_lost_ranges();

 private:
  DeviceBackend& backend_;
  BlockCache& cache_;
  DeviceStats& stats_;
  TraceRecorder& trace_;
  const std::size_t page_;
  std::map<std::uintptr_t, PageTable> tables_;  // by reservation base
  std::vector<Stream> streams_;
  // Mapped ranges that neither unmap nor become accessible after a failed map (address, bytes).
  std::vector<std::pair<std::uintptr_t, std::size_t>> lost_ranges_;
};

}  // namespace stowage
