#include "snapshot/segment_findings.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <optional>

#include "snapshot/frame_sites.hpp"

namespace stowage::snapshot {

namespace {

struct Bucket {
  std::optional<std::uint64_t> limit;  // none: no limit
  const char* label;
};

constexpr std::array<Bucket, 5> kBuckets = {{{std::uint64_t{2} << 20, "<= 2 MiB"},
                                             {std::uint64_t{20} << 20, "<= 20 MiB"},
                                             {std::uint64_t{128} << 20, "<= 128 MiB"},
                                             {std::uint64_t{1} << 30, "<= 1 GiB"},
                                             {std::nullopt, "> 1 GiB"}}};

bool is_active(const BlockFacts& block) { return block.state.starts_with("active"); }

double ratio(Wide part, Wide whole) { return static_cast<double>(part) / static_cast<double>(whole); }

}  // namespace

std::string site_of(const BlockFacts& block, Wide size) {
  if (block.frame_site) return *block.frame_site;
  return size_class(size < 0 ? 0 : static_cast<std::uint64_t>(size));
}

Totals totals_of(const std::vector<SegmentInput>& segments) {
  Totals totals;
  totals.segments = static_cast<std::int64_t>(segments.size());
  for (const SegmentInput& segment : segments) {
    totals.reserved += segment.total;
    for (const BlockFacts& block : segment.blocks) {
      if (block.state == "active_allocated") {
        totals.allocated += block.size;
        totals.requested += block.requested;
      }
      if (is_active(block)) {
        totals.active += block.size;
      } else if (block.state == "inactive") {
        totals.largest_free_block = std::max(totals.largest_free_block, block.size);
      }
    }
  }
  totals.reserved_unallocated = totals.reserved - totals.allocated;
  const Wide free = totals.reserved - totals.active;
  totals.fragmentation = free > 0 ? 1 - ratio(totals.largest_free_block, free) : 0.0;
  return totals;
}

SegmentSummary summary_of(const std::vector<SegmentInput>& segments, std::size_t top) {
  SegmentSummary summary;
  summary.count = static_cast<std::int64_t>(segments.size());
  std::array<SizeBucket, kBuckets.size()> buckets{};
  std::vector<double> fills;
  std::vector<HeldSegment> held;
  for (const SegmentInput& segment : segments) {
    for (std::size_t k = 0; k < kBuckets.size(); ++k) {
      if (kBuckets[k].limit && segment.total > static_cast<Wide>(*kBuckets[k].limit)) continue;
      ++buckets[k].count;
      buckets[k].bytes += segment.total;
      break;
    }
    const BlockFacts* live_block = nullptr;
    std::size_t live = 0;
    Wide live_bytes = 0;
    for (const BlockFacts& block : segment.blocks) {
      if (!is_active(block)) continue;
      live_block = &block;
      ++live;
      live_bytes += block.size;
    }
    fills.push_back(segment.total != 0 ? ratio(live_bytes, segment.total) : 0.0);
    if (live == 1 && 4 * live_bytes < segment.total && !segment.expandable) {
      held.push_back({segment.address, segment.total, live_bytes, segment.total - live_bytes,
                      site_of(*live_block, live_bytes)});
    }
  }
  for (std::size_t k = 0; k < kBuckets.size(); ++k) {
    if (buckets[k].count == 0) continue;
    buckets[k].size = kBuckets[k].label;
    summary.by_size.push_back(buckets[k]);
  }
  if (!fills.empty()) {
    std::sort(fills.begin(), fills.end());
    const auto n = static_cast<double>(fills.size());
    for (const double q : {0.25, 0.5, 0.75}) {
      summary.fill_quartiles.push_back(fills[std::min(fills.size() - 1, static_cast<std::size_t>(q * n))]);
    }
  }
  std::stable_sort(held.begin(), held.end(),
                   [](const HeldSegment& a, const HeldSegment& b) { return a.held_back > b.held_back; });
  if (held.size() > top) held.resize(top);
  summary.held_by_one_small_block = std::move(held);
  return summary;
}

std::vector<SiteLive> sites_at_end(const std::vector<SegmentInput>& segments, std::size_t top) {
  std::vector<SiteLive> sites;
  std::map<std::string, std::size_t> found;  // a site's row
  for (const SegmentInput& segment : segments) {
    for (const BlockFacts& block : segment.blocks) {
      if (block.state != "active_allocated") continue;
      std::string site = site_of(block, block.requested);  // classified by the size asked for, as events are
      const auto [row, added] = found.try_emplace(site, sites.size());
      if (added) sites.push_back({std::move(site), 0, 0});
      sites[row->second].bytes += block.size;
      ++sites[row->second].allocations;
    }
  }
  std::stable_sort(sites.begin(), sites.end(), [](const SiteLive& a, const SiteLive& b) { return a.bytes > b.bytes; });
  if (sites.size() > top) sites.resize(top);
  return sites;
}

}  // namespace stowage::snapshot
