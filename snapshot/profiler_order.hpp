// torch.profiler's CPU allocation events (stowage.profiler_snapshot) put in order: by time, and
// within one timestamp in the one order consistent with the running total of allocated bytes the
// profiler records beside each event (each event's total less its signed size is the total after
// the event before it; where no event follows on, the first left of that timestamp goes next).
//
// profiled_trace lays those events out as a snapshot's device trace: in that order, an alloc for a
// positive size, free_requested then free_completed for a negative one, and before the first event
// at or after each step's end (`marks`, in any order) a step-end mark; the marks after the last
// event close the trace.
//
// Contract: pure functions; profiler_order returns the events' indexes, a permutation of [0, n).
// Columns of unequal length raise LogicError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace stowage::snapshot {

std::vector<std::size_t> profiler_order(std::span<const std::int64_t> time_ns, std::span<const std::int64_t> size,
                                        std::span<const std::int64_t> total_after);

struct ProfiledEvent {
  enum class Kind { kAlloc, kFreeRequested, kFreeCompleted, kStepEnd } kind;
  std::uint64_t address = 0, size = 0;  // 0 for a step end
  std::int64_t time_us = 0;             // the event's nanoseconds // 1000, rounded down
};

std::vector<ProfiledEvent> profiled_trace(std::span<const std::int64_t> time_ns, std::span<const std::uint64_t> address,
                                          std::span<const std::int64_t> size, std::span<const std::int64_t> total_after,
                                          std::vector<std::int64_t> marks);

}  // namespace stowage::snapshot
