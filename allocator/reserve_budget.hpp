// ReserveBudget: how much memory an allocator reserves beyond what it has ever had in use.
//
// Note [Reserve budget]
// A cache built by one phase of a step is often the wrong shape for the next: on the segment
// path a freed segment can serve only what fits in it, and on the paged path new pages could be
// made where cached ones could be moved. Left alone, reserved memory drifts far above the peak
// in use (bench/results/2026-11-22-cpu-segment-path.md). So new memory is taken freely only
// while reserved bytes stay within the budget, the headroom over the peak in use plus an
// allowance learned from churn:
//   reserved <= (1 + reserve_headroom) x in use + allowance,
// where "in use" is the most bytes ever active, or the bytes active now plus the request if
// that is more. Beyond it the memory sources make room first: the segment source returns its
// wholly free cached segments (after waiting for pending frees; on a GPU cudaFree also waits for
// the device) before asking the device for a new one; the paged source, once the device's room
// is spent (move_pages_above), moves cached pages (Note [Stitching] in page_stitcher.hpp) before
// it creates new ones.
// Making room costs device calls, so a loop whose layout does not fit keeps paying them step
// after step. That churn is counted: each time the memory returned or moved since the peak in
// use last rose reaches an eighth of that peak, the allowance grows by 1% of the peak (at least
// one granule: a page, or a medium segment), until the layout fits and the calls stop. So steady
// training stops calling the device once warm, at the cost of a little memory only where the
// layout needs it. reserve_headroom:1 turns the rule off (new memory whenever the device and the
// limit allow, PyTorch's policy).
//
// Contract: not thread-safe (the allocator's lock guards it). Reads the block cache's active
// bytes and their high water; never changes the cache.
#pragma once

#include <cstddef>

namespace stowage {

class BlockCache;

class ReserveBudget {
 public:
  // `headroom` is reserve_headroom (0 to 1); `granule` the least the allowance grows by.
  ReserveBudget(const BlockCache& cache, double headroom, std::size_t granule)
      : cache_(cache), headroom_(headroom), granule_(granule) {}

  // Whether the rule is off (reserve_headroom:1).
  bool unbounded() const noexcept { return headroom_ >= 1; }
  // Whether reserved bytes may reach `reserved` for a request of `request` bytes.
  bool allows(std::size_t reserved, std::size_t request) const noexcept;
  // `bytes` were returned to the device or moved to make room; grows the allowance when the
  // churn since the peak last rose reaches an eighth of it.
  void note_churn(std::size_t bytes) noexcept;
  std::size_t allowance() const noexcept { return allowance_; }

 private:
  const BlockCache& cache_;
  const double headroom_;
  const std::size_t granule_;
  std::size_t allowance_ = 0;   // reserve allowed beyond the headroom, learned from churn
  std::size_t churn_ = 0;       // bytes returned or moved since the high water last rose
  std::size_t churn_high_water_ = 0;  // the high water churn_ counts from
};

}  // namespace stowage
