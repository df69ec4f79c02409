// PagedSource: the shared pool's memory as pages mapped into reserved address space, where the
// device has virtual memory.
//
// Note [Paged path]
// Each (size class, stream) has an address reservation (PagedMemory), and physical memory comes
// in pages of the device's granularity (2 MiB on current GPUs) that blocks share, so requests
// keep their 512 B rounding and reserved bytes are exactly the pages mapped. Free blocks over
// mapped pages are the cache, found by best fit as on the segment path; address space with no
// pages under it forms holes. On a miss the source maps pages into a hole, choosing whichever of
// two holes needs fewer new pages:
//   - the best-fitting hole; or
//   - the stream's largest hole, normally the unmapped tail of its reservation.
// A hole right after a free mapped block extends that block, so the request needs pages only
// for what the block lacks: the reservation grows at its end like PyTorch's expandable
// segments, and a batch that grows by one row costs one page instead of a new segment per
// layer. The pages come from the PageStitcher (Note [Stitching] in page_stitcher.hpp). Ranges
// built this way stay mapped and cached after their blocks are freed, so a training loop that
// repeats its allocations finds them again. Live mappings are bounded by reserved bytes / page
// size. release_cached (empty_cache) unmaps and releases every whole page under the shared
// pool's free mapped blocks and returns reservations with nothing mapped; a miss does not
// (stitching already uses those pages), except that a learned layout's arena, when it opens,
// gives back the shared pool's free pages first (Note [Learned placement]).
//
// Contract: called under the allocator's lock; see memory_source.hpp.
#pragma once

#include "allocator/memory_source.hpp"
#include "allocator/page_stitcher.hpp"
#include "allocator/paged_memory.hpp"

namespace stowage {

class PagedSource final : public MemorySource {
 public:
  // Throws LogicError when the device has no virtual memory.
  explicit PagedSource(const SourceParts& parts);

  Block* grow(const GrowRequest& request) override;
  // Pages under blocks that just completed can be moved: the same steps as grow().
  Block* grow_again(const GrowRequest& request) override { return grow(request); }
  bool release_cached() override;
  bool splits_fresh_blocks() const noexcept override { return true; }
  bool spares_whole_segments() const noexcept override { return false; }

  PagedMemory& memory() noexcept { return memory_; }
  PageStitcher& stitcher() noexcept { return stitcher_; }

 private:
  struct Choice {
    Block* hole = nullptr;
    std::size_t pages = 0;  // new pages needed, after what a free block before the hole holds
  };
  // The hole needing the fewest new pages for the request (Note [Paged path]), reserving one
  // if need be; {nullptr, 0} if none.
  Choice choose_hole(const GrowRequest& request);
  // Stitching moved whole blocks: keeps the surplus after the request that the hole can take as
  // cache (short of any range set aside and, with an oversize class, below it: a remainder the
  // cache refuses would only be moved again) and gives the rest back.
  void trim_surplus(const Choice& choice, std::vector<PhysicalHandle>& handles);
  Block* reserve(const GrowRequest& request);

  DeviceBackend& backend_;
  BlockCache& cache_;
  DeviceStats& stats_;
  Pool& shared_;
  const std::size_t max_split_size_;
  const std::size_t device_bytes_;
  PagedMemory memory_;
  PageStitcher stitcher_;
};

}  // namespace stowage
