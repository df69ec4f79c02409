// `stowage inspect`'s findings about one device of a memory snapshot, in one call: what its
// segments say at the end (segment_findings.hpp) and what its trace says (trace_findings.hpp),
// the latter's baseline and advice fed from the former. stowage.inspection formats them.
//
// Contract: a pure function of its inputs; bad inputs raise LogicError naming them.
#pragma once

#include <cstddef>
#include <vector>

#include "snapshot/segment_findings.hpp"
#include "snapshot/trace_findings.hpp"

namespace stowage::snapshot {

struct InspectOptions {
  std::size_t top = 10;        // sites, modules, segments and growing sites listed
  bool under_stowage = false;  // stowage's allocator recorded the snapshot
  std::optional<ExactTags> tags;
  bool timelines = false;  // the HTML report's timelines and the segments' block sites too
  std::vector<std::int64_t> moments;  // TraceOptions::moments
};

struct Findings {
  Totals totals;
  SegmentSummary segments;
  std::vector<SiteLive> sites_at_end;
  TraceFindings trace;
  std::vector<std::vector<std::string>> block_sites;  // each segment's blocks' sites (by size), with timelines
};

// Without segments the snapshot tells nothing about the end state: the trace's own balance is
// then taken as the whole story.
Findings inspect(const TraceInput& trace, const std::vector<SegmentInput>& segments, InspectOptions options);

}  // namespace stowage::snapshot
