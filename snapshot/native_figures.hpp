// What the allocator that recorded a trace did, as far as its snapshot tells (stowage replay's
// "native" figures): the peak of its reserved memory (reserved_peak in device_events.hpp), and the
// segments that held memory before the trace began, which make that peak incomparable with a
// replay from empty when the trace's own allocations land in them.
//
// Contract: a pure function. Segment addresses and sizes are the snapshot's integers, read in 128
// bits (they are checked only as integers); trace addresses are below 2**64. Columns of unequal
// length raise LogicError.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "snapshot/live_series.hpp"

namespace stowage::snapshot {

// One of the snapshot's segments on the device.
struct SegmentExtent {
  Wide address = 0;
  Wide size = 0;
};

struct NativeFigures {
  std::optional<Wide> peak_reserved;  // none: the trace has no segment events
  std::int64_t preexisting_segments = 0;  // segments no trace event created
  Wide preexisting_bytes = 0;
  std::int64_t allocs_in_preexisting = 0;  // trace allocations that landed in those segments
  Wide bytes_in_preexisting = 0;           // ... and their requested bytes

  // Whether the native peak can be set beside a replay that starts from empty: the trace has
  // segment events, and what its allocations took from memory cached before it began is
  // negligible (at most 0.1% of its peak of requested bytes).
  bool comparable(Wide peak_requested) const {
    return peak_reserved.has_value() && bytes_in_preexisting * 1000 <= peak_requested;
  }
};

// `segments`: the device's segments, in any order. An allocation lands in a preexisting segment
// when the last such segment, in (address, size) order, that begins at or below its address
// holds it.
NativeFigures native_figures(std::span<const std::uint8_t> action, std::span<const std::uint64_t> addr,
                             std::span<const std::uint64_t> size, std::span<const SegmentExtent> segments);

}  // namespace stowage::snapshot
