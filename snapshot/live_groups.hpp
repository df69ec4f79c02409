// Live bytes by group over a trace (the HTML report's timelines: by site, category or module),
// sampled: at most max_points positions evenly spaced, the series' peak and the last position
// always among them.
//
// Positions are LivePairs' (snapshot/live_pairs.hpp): `own[p]` position p's change of the trace's
// own live bytes, `unknown[p]` the bytes an unknown free took of what was live before the trace,
// `alloc_of[p]` a matched free's allocation (-1 else), `group[p]` an allocation's group (0 ..
// groups - 1; any other value: in no group). A free leaves its allocation's group. Pure; bad
// arguments raise LogicError.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "snapshot/live_series.hpp"

namespace stowage::snapshot {

struct GroupedLive {
  std::vector<std::int64_t> positions;   // the samples, ascending
  std::int64_t peak = -1;                // the first position where own - unknown is highest
  std::vector<Wide> unknown_freed;       // unknown frees' bytes up to each sample
  std::vector<std::vector<Wide>> series;  // by group: its live bytes at each sample
};

GroupedLive grouped_live(std::span<const std::int64_t> own, std::span<const std::int64_t> unknown,
                         std::span<const std::uint8_t> is_alloc, std::span<const std::int64_t> alloc_of,
                         std::span<const std::int64_t> group, std::size_t groups, std::size_t max_points);

// Live bytes and allocations by group just after `position` (the allocations at or before it
// that no free has ended by then; none before position 0): the inspector's sites at its peak.
struct LiveAt {
  std::vector<Wide> bytes;
  std::vector<std::int64_t> count;
};
LiveAt live_at(std::span<const std::uint8_t> is_alloc, std::span<const std::int64_t> end,
               std::span<const std::int64_t> size, std::span<const std::int64_t> group, std::size_t groups,
               std::int64_t position);

// The groups whose live bytes (live_at's) grew at every one of `positions` (the ends of the steps
// judged, in order; -1: before any event, where nothing is live), each with the bytes it added a
// step (its growth over them floored over the steps between) and the number of positions: those
// live at the last, in the order of their first allocation (`first[g]`, ties by group), then the
// largest growth first (trace_findings.hpp's growing sites).
struct Growing {
  std::int64_t group = 0;
  Wide bytes_per_step = 0;
  std::int64_t steps = 0;
};
std::vector<Growing> growing_groups(std::span<const std::uint8_t> is_alloc, std::span<const std::int64_t> end,
                                    std::span<const std::int64_t> size, std::span<const std::int64_t> group,
                                    std::span<const std::int64_t> first, std::span<const std::int64_t> positions);

}  // namespace stowage::snapshot
