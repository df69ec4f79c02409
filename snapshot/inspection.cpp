#include "snapshot/inspection.hpp"

#include <utility>

namespace stowage::snapshot {

Findings inspect(const TraceInput& trace, const std::vector<SegmentInput>& segments, InspectOptions options) {
  Findings found;
  found.totals = totals_of(segments);
  found.segments = summary_of(segments, options.top);
  found.sites_at_end = sites_at_end(segments, options.top);
  TraceOptions trace_options;
  if (!segments.empty()) trace_options.requested_at_end = found.totals.requested;
  trace_options.top = options.top;
  trace_options.cached_free = found.totals.reserved_unallocated;
  trace_options.under_stowage = options.under_stowage;
  trace_options.tags = std::move(options.tags);
  trace_options.timelines = options.timelines;
  trace_options.moments = std::move(options.moments);
  found.trace = analyse_trace(trace, trace_options);
  if (!options.timelines) return found;
  for (const SegmentInput& segment : segments) {
    std::vector<std::string>& sites = found.block_sites.emplace_back();
    for (const BlockFacts& block : segment.blocks) sites.push_back(site_of(block, block.size));
  }
  return found;
}

}  // namespace stowage::snapshot
