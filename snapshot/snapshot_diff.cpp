#include "snapshot/snapshot_diff.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "snapshot/inspection.hpp"

namespace stowage::snapshot {

namespace {

template <typename T>
void keep_top(std::vector<T>& rows, std::size_t top) {
  if (rows.size() > top) rows.resize(top);
}

// Each key's segment (the last given with it), in the order keys first appear.
struct Keyed {
  std::map<std::pair<Wide, Wide>, std::size_t> at;  // key -> index into order
  std::vector<std::pair<std::pair<Wide, Wide>, const SegmentFacts*>> order;
};

Keyed keyed(const std::vector<SegmentFacts>& segments) {
  Keyed out;
  for (const SegmentFacts& segment : segments) {
    const std::pair<Wide, Wide> key{segment.address, segment.expandable ? Wide{0} : segment.size};
    const auto [where, added] = out.at.emplace(key, out.order.size());
    if (added) {
      out.order.emplace_back(key, &segment);
    } else {
      out.order[where->second].second = &segment;
    }
  }
  return out;
}

}  // namespace

SitesDiff diff_sites(const std::vector<SiteBytes>& before, const std::vector<SiteBytes>& after, std::size_t top) {
  std::vector<SiteChange> changes;
  std::map<std::string, std::size_t> at;
  for (const SiteBytes& site : before) {
    if (at.emplace(site.site, changes.size()).second) changes.push_back({site.site, 0, 0, 0});
    changes[at[site.site]].before = site.bytes;
  }
  for (const SiteBytes& site : after) {
    if (at.emplace(site.site, changes.size()).second) changes.push_back({site.site, 0, 0, 0});
    changes[at[site.site]].after = site.bytes;
  }
  SitesDiff found;
  for (SiteChange& change : changes) {
    change.change = change.after - change.before;
    if (change.change > 0) found.grew.push_back(change);
    if (change.change < 0) found.shrank.push_back(change);
  }
  std::stable_sort(found.grew.begin(), found.grew.end(),
                   [](const SiteChange& a, const SiteChange& b) { return a.change > b.change; });
  std::stable_sort(found.shrank.begin(), found.shrank.end(),
                   [](const SiteChange& a, const SiteChange& b) { return a.change < b.change; });
  keep_top(found.grew, top);
  keep_top(found.shrank, top);
  return found;
}

SegmentsDiff diff_segments(const std::vector<SegmentFacts>& before, const std::vector<SegmentFacts>& after,
                           std::size_t top) {
  const Keyed a = keyed(before), b = keyed(after);
  SegmentsDiff found;
  for (const auto& [key, segment] : a.order) {
    const auto other = b.at.find(key);
    if (other == b.at.end()) {
      ++found.only_before;
      found.only_before_bytes += segment->size;
      continue;
    }
    const SegmentFacts& later = *b.order[other->second].second;
    const SegmentChange change{key.first,   segment->size, later.size, segment->live,
                               later.live, later.live - segment->live};
    if (change.size_after != change.size_before || change.live_change != 0) found.changed.push_back(change);
  }
  for (const auto& [key, segment] : b.order) {
    if (a.at.count(key) == 0) {
      ++found.only_after;
      found.only_after_bytes += segment->size;
    }
  }
  const auto magnitude = [](Wide value) { return value < 0 ? -value : value; };
  std::stable_sort(found.changed.begin(), found.changed.end(), [&](const SegmentChange& x, const SegmentChange& y) {
    return magnitude(x.live_change) > magnitude(y.live_change);
  });
  found.changed_count = found.changed.size();
  keep_top(found.changed, top);
  return found;
}

namespace {

constexpr std::size_t kEverySite = std::size_t{1} << 30;  // sites listed: all a snapshot has

// A snapshot's totals, and its live bytes by site at the end (every site).
std::pair<SnapshotTotals, std::vector<SiteBytes>> findings_of(const SnapshotInput& snapshot) {
  const Findings found = inspect(snapshot.trace, snapshot.segments, {kEverySite, false, std::nullopt, false, {}});
  const Totals& totals = found.totals;
  SnapshotTotals out{totals.allocated, totals.reserved, totals.largest_free_block, totals.segments,
                     totals.fragmentation, std::nullopt};
  if (!snapshot.trace.action.empty()) out.trace_peak = found.trace.peak.live_bytes;
  std::vector<SiteBytes> sites;
  for (const SiteLive& site : found.sites_at_end) sites.push_back({site.site, site.bytes});
  return {out, std::move(sites)};
}

std::vector<SegmentFacts> facts_of(const std::vector<SegmentInput>& segments) {
  std::vector<SegmentFacts> out;
  for (const SegmentInput& segment : segments) {
    Wide live = 0;
    for (const BlockFacts& block : segment.blocks) live += block.state == "active_allocated" ? block.size : 0;
    out.push_back({segment.address, segment.total, segment.expandable, live});
  }
  return out;
}

}  // namespace

SnapshotsDiff diff_snapshots(const SnapshotInput& before, const SnapshotInput& after, std::size_t top) {
  auto [before_totals, before_sites] = findings_of(before);
  auto [after_totals, after_sites] = findings_of(after);
  return {before_totals, after_totals, diff_sites(before_sites, after_sites, top),
          diff_segments(facts_of(before.segments), facts_of(after.segments), top)};
}

}  // namespace stowage::snapshot
