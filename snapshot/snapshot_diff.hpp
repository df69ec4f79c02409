// `stowage diff A B`: what grew or shrank between two memory snapshots of one device (the
// wording is diff_report.hpp's; this is the comparison).
//
// - Sites: the live bytes by allocation site at the end (sites as `stowage inspect` names them)
//   in A and in B; the sites that grew, most first, and those that shrank, most first (ties in
//   the order the sites are given: A's, then those only in B).
// - Segments: the same segment when address and size agree; an expandable segment (a mapped
//   range of one reservation) is the same range when its start agrees, whatever it grew or
//   shrank to. Those only in A were given back, those only in B are new, and those in both whose
//   size or live bytes changed are listed by how much their live bytes changed, most first (ties
//   in A's order). Where two segments of one snapshot share a key, the later one stands for it.
//
// - Totals: each snapshot's allocated, reserved, segments, largest free block and fragmentation
//   (segment_findings.hpp) and its trace's live peak (none for an empty trace), as inspect finds
//   them; diff_snapshots compares all three in one call.
//
// Byte counts are summed in 128 bits (Note [Live bytes in 128 bits]). Pure functions, no state.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "snapshot/live_series.hpp"
#include "snapshot/segment_findings.hpp"
#include "snapshot/trace_findings.hpp"

namespace stowage::snapshot {

struct SiteBytes {
  std::string site;
  Wide bytes = 0;
};

struct SiteChange {
  std::string site;
  Wide before = 0, after = 0, change = 0;
};

struct SitesDiff {
  std::vector<SiteChange> grew, shrank;  // each at most `top` long
};

SitesDiff diff_sites(const std::vector<SiteBytes>& before, const std::vector<SiteBytes>& after, std::size_t top);

struct SegmentFacts {
  Wide address = 0, size = 0;
  bool expandable = false;
  Wide live = 0;  // its active_allocated blocks' bytes
};

struct SegmentChange {
  Wide address = 0, size_before = 0, size_after = 0, live_before = 0, live_after = 0, live_change = 0;
};

struct SegmentsDiff {
  std::size_t only_before = 0, only_after = 0;
  Wide only_before_bytes = 0, only_after_bytes = 0;
  std::vector<SegmentChange> changed;  // at most `top`
  std::size_t changed_count = 0;       // all that changed
};

SegmentsDiff diff_segments(const std::vector<SegmentFacts>& before, const std::vector<SegmentFacts>& after,
                           std::size_t top);

// One snapshot of the device, as inspect reads it.
struct SnapshotInput {
  const TraceInput& trace;
  const std::vector<SegmentInput>& segments;
};

struct SnapshotTotals {
  Wide allocated = 0, reserved = 0, largest_free_block = 0;
  std::int64_t segments = 0;
  double fragmentation = 0.0;
  std::optional<Wide> trace_peak;  // none: the trace has no events
};

struct SnapshotsDiff {
  SnapshotTotals before, after;
  SitesDiff sites;
  SegmentsDiff segments;
};

SnapshotsDiff diff_snapshots(const SnapshotInput& before, const SnapshotInput& after, std::size_t top);

}  // namespace stowage::snapshot
