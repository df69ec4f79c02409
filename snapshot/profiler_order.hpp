// torch.profiler's CPU allocation events (stowage.profiler_snapshot) put in order: by time, and
// within one timestamp in the one order consistent with the running total of allocated bytes the
// profiler records beside each event (each event's total less its signed size is the total after
// the event before it; where no event follows on, the first left of that timestamp goes next).
//
// Contract: a pure function; returns the events' indexes, a permutation of [0, n). Columns of
// unequal length raise LogicError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace stowage::snapshot {

std::vector<std::size_t> profiler_order(std::span<const std::int64_t> time_ns, std::span<const std::int64_t> size,
                                        std::span<const std::int64_t> total_after);

}  // namespace stowage::snapshot
