// A trace's alloc and free_completed events paired (trace_sites.hpp's LivePairs owns them): the events are
// "positions" 0..n-1, in trace order, and each free is matched with the allocation it ends as a
// dict from address to the latest event there would match it: a free ends the latest allocation
// of its address if no free came between them; otherwise it frees memory that was live before
// the trace began (an "unknown" free). An allocation whose address is allocated again before any
// free is never ended.
//
// The caller owns the output (numpy's arrays, as a rule): count_positions() says how long each
// must be, pair_allocations() fills them. `Position` is int32_t for traces below 2**31 events,
// int64_t above. Sizes are read as int64 (every size is below 2**50: kMaxSize). Pure functions.
#pragma once

#include <cstdint>
#include <span>

namespace stowage::snapshot {

template <typename Position>
struct LivePairsOut {
  std::span<Position> index;         // the events' indexes in the trace
  std::span<std::uint8_t> is_alloc;  // (numpy bools)
  std::span<std::int64_t> size;
  std::span<std::int64_t> own;       // change of the trace's own live bytes: +size, or minus the ended allocation's
  std::span<std::int64_t> unknown;   // the size of each unknown free, else 0
  std::span<Position> alloc_of;      // for a matched free, the position of the allocation it ends, else -1
  std::span<Position> end;           // for an allocation, the position of the free that ends it, else n
};

// The number of positions: alloc and free_completed events.
std::size_t count_positions(std::span<const std::uint8_t> action);

// Fills `out` (each span count_positions() long); raises LogicError on columns of unequal length.
template <typename Position>
void pair_allocations(std::span<const std::uint8_t> action, std::span<const std::uint64_t> addr,
                      std::span<const std::uint64_t> size, const LivePairsOut<Position>& out);

extern template void pair_allocations<std::int32_t>(std::span<const std::uint8_t>, std::span<const std::uint64_t>,
                                                    std::span<const std::uint64_t>, const LivePairsOut<std::int32_t>&);
extern template void pair_allocations<std::int64_t>(std::span<const std::uint8_t>, std::span<const std::uint64_t>,
                                                    std::span<const std::uint64_t>, const LivePairsOut<std::int64_t>&);

}  // namespace stowage::snapshot
