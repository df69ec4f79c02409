// PageStitcher: where the pages for a range of paged memory come from (the page-moving policy).
//
// Note [Stitching]
// Moving a page costs an unmap, a map and a wait for the stream that last used it; making a new
// one costs memory. While the device has room, memory is the cheaper of the two: a training loop
// whose shapes change from step to step (variable sequence lengths, say) would otherwise move
// pages every step, forever. So pages for a request come, in order, from:
//   1. new physical memory, while reserved bytes stay within move_pages_above x the memory limit
//      (the room the device has) or within the reserve budget (Note [Reserve budget] in
//      reserve_budget.hpp): with room, every range a loop needs stays mapped after its first
//      steps and no device call is made once warm; near the cap the budget rules, so the
//      forward pass grows the reserve at its tail and later misses move pages rather than add
//      them;
//   2. stitching: the whole pages of the shared pool's free mapped blocks anywhere (any stream,
//      either size class, largest blocks first, each block's pages all at once unless that is
//      far more than missing) are unmapped and mapped where they are needed, the surplus after
//      the request as cache; so a request that fits in the total free memory never fails for
//      want of a contiguous range, and free memory gathers at the growth front instead of being
//      chopped into slivers. The owner stream of a moved page is synchronised first: its queued
//      work may still use the page. Moving is counted as churn of the budget;
//   3. new physical memory up to the limit.
// Under a CUDA graph capture nothing is moved (moving waits for a stream).
//
// Contract: not thread-safe (the allocator's lock guards it). Owns nothing: the pages it moves
// are the PagedMemory's, the blocks the BlockCache's.
#pragma once

#include <cstddef>
#include <vector>

#include "allocator/memory_limit.hpp"
#include "allocator/paged_memory.hpp"
#include "allocator/reserve_budget.hpp"

namespace stowage {

class PageStitcher {
 public:
  // `move_above`: the share of the limit up to which new pages are made without moving cached
  // ones (Note [Stitching]).
  PageStitcher(DeviceBackend& backend, PagedMemory& memory, DeviceStats& stats,
               const MemoryLimit& limit, ReserveBudget& budget, Pool& shared, double move_above);

  // Adds `count` pages to `handles` for a request of `rounded` bytes, from the sources of Note
  // [Stitching] in order, never unmapping `keep` (a free block the pages will join). False
  // (handles partly filled) when that is not enough.
  bool gather(std::size_t count, std::size_t rounded, const Block* keep, bool capturing,
              std::vector<PhysicalHandle>& handles);

 private:
  // Unmaps whole pages of free mapped blocks other than `keep`, largest blocks first, until at
  // least `count` pages have been added to `out`; returns how many were added.
  std::size_t steal(std::size_t count, const Block* keep, std::vector<PhysicalHandle>& out);
  // The free mapped blocks to take pages from, largest first.
  std::vector<Block*> victims(std::size_t count, const Block* keep);

  DeviceBackend& backend_;
  PagedMemory& memory_;
  DeviceStats& stats_;
  const MemoryLimit& limit_;
  ReserveBudget& budget_;
  Pool& shared_;
  const double move_above_;
};

}  // namespace stowage
