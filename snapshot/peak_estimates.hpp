// The peak a trace's live series would have with some allocations' lives changed: what the
// inspector's advice re-simulates its savings with (snapshot/advice.hpp).
//
// Positions are LivePairs' (live_pairs.hpp): n = live.size() of them; `end[p]` is the
// position of the free that ends the allocation at p (n: never freed), `size[p]` its bytes.
// Every function checks its positions (a bad one raises LogicError naming it) and returns the
// changed series' peak, exactly (Note [Live bytes in 128 bits] in snapshot/live_series.hpp);
// an empty series' peak is 0. Pure functions, no state.
//
// - removed_peak: the allocations `removed` gone over their whole lives;
// - freed_when_made_peak: allocations `kept` across steps (sorted) freed as soon as the group
//   they were made in is made: groups are split by backward's allocations (what one forward
//   kept has none between its allocations); where none splits them, at their step's end;
// - grads_set_to_none_peak: gradients `kept` (allocated in backward, kept across steps:
//   zero_grad(set_to_none=False)) freed at each step's end, and each later step's own gradient
//   (the allocation at the same place in that step's backward, of the same size, freed in that
//   step: backward added it into the kept one) kept to its step's end instead.
// `step_starts`: the positions where steps begin (sorted; empty: one step); `backward_allocs`:
// the positions of backward's allocations (sorted).
#pragma once

#include <cstdint>
#include <span>

#include "snapshot/live_series.hpp"

namespace stowage::snapshot {

using Positions = std::span<const std::int64_t>;

// The series' peak with `change` (one entry a position) added to its running sum.
Wide changed_peak(const LiveSeries& live, std::span<const std::int64_t> change);
// The same with wide changes, of which the first live.size() are read.
Wide changed_peak_wide(const LiveSeries& live, std::span<const Wide> change);

Wide removed_peak(const LiveSeries& live, Positions end, std::span<const std::int64_t> size, Positions removed);

Wide freed_when_made_peak(const LiveSeries& live, Positions end, std::span<const std::int64_t> size, Positions kept,
                          Positions backward_allocs, Positions step_starts);

Wide grads_set_to_none_peak(const LiveSeries& live, std::span<const std::uint8_t> is_alloc, Positions end,
                            std::span<const std::int64_t> size, Positions kept, Positions backward_allocs,
                            Positions step_starts);

}  // namespace stowage::snapshot
