// A device's trace as replay reads it (stowage.replay): the events stowage._core.ReplayEvents replays,
// the reserved-memory peak of the allocator that recorded it, and the period its steps repeat at.
//
// Columns are TraceColumns' (one entry an event). Pure functions; columns of unequal length, or
// marks out of order or range, raise LogicError.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "snapshot/live_series.hpp"

namespace stowage::snapshot {

// stowage._core.ReplayEvents' event kinds.
inline constexpr std::uint8_t kReplayAlloc = 0, kReplayFree = 1, kReplayStepEnd = 2;

struct TraceColumnsView {
  std::span<const std::uint8_t> action;
  std::span<const std::uint64_t> addr, size, stream;
};

// The alloc and free_completed events (a free: the moment memory really became free), and the
// step ends stowage.mark_step() recorded ("snapshot" events among `step_marks`, the event indexes
// whose user_metadata names a step mark, ascending), in order. A step end has no address, size or
// stream (0). `kinds` etc. are filled, each count_device_events() long.
std::size_t count_device_events(const TraceColumnsView& columns, std::span<const std::int64_t> step_marks);
void fill_device_events(const TraceColumnsView& columns, std::span<const std::int64_t> step_marks,
                        std::span<std::uint8_t> kinds, std::span<std::uint64_t> addr, std::span<std::uint64_t> size,
                        std::span<std::uint64_t> stream);

// The peak of the running sum of segment growth (segment_alloc and segment_map bytes, less
// segment_free and segment_unmap bytes; never below 0), none without segment events; and the
// addresses of the segments the trace created (ascending, each once).
struct ReservedPeak {
  std::optional<Wide> peak;
  std::vector<std::uint64_t> created;
};
ReservedPeak reserved_peak(std::span<const std::uint8_t> action, std::span<const std::uint64_t> addr,
                           std::span<const std::uint64_t> size);

// The number of steps after which the steps repeat (1: every step alike), judged by the sizes each
// step allocates in order, the first step left out (it makes the optimizer's state); none when
// they never do. Steps end at kReplayStepEnd events; what follows the last is no step.
std::optional<std::int64_t> step_period(std::span<const std::uint8_t> kinds, std::span<const std::uint64_t> sizes);

}  // namespace stowage::snapshot
