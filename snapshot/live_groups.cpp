#include "snapshot/live_groups.hpp"

#include <algorithm>
#include <cstddef>

#include "base/errors.hpp"

namespace stowage::snapshot {

namespace {

std::size_t at(std::int64_t position) { return static_cast<std::size_t>(position); }

// Evenly spaced positions (a stride that keeps them within max_points), the peak and the last.
std::vector<std::int64_t> samples(std::size_t n, std::size_t max_points, std::int64_t peak) {
  const std::size_t stride = std::max<std::size_t>(1, (n + max_points - 1) / max_points);
  std::vector<std::int64_t> positions;
  for (std::size_t p = 0; p < n; p += stride) positions.push_back(static_cast<std::int64_t>(p));
  positions.push_back(peak);
  positions.push_back(static_cast<std::int64_t>(n) - 1);
  std::sort(positions.begin(), positions.end());
  positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
  return positions;
}

}  // namespace

GroupedLive grouped_live(std::span<const std::int64_t> own, std::span<const std::int64_t> unknown,
                         std::span<const std::uint8_t> is_alloc, std::span<const std::int64_t> alloc_of,
                         std::span<const std::int64_t> group, std::size_t groups, std::size_t max_points) {
  const std::size_t n = own.size();
  STOWAGE_CHECK(unknown.size() == n && is_alloc.size() == n && alloc_of.size() == n && group.size() == n,
                "own (", n, "), unknown, is_alloc, alloc_of and group must have one entry a position");
  STOWAGE_CHECK(max_points > 0, "max_points must be positive");
  for (const std::int64_t allocation : alloc_of) {
    STOWAGE_CHECK(allocation >= -1 && allocation < static_cast<std::int64_t>(n), "alloc_of ", allocation,
                  " is outside -1..", n - 1);
  }
  GroupedLive found;
  if (n == 0) return found;
  Wide running = 0, highest = 0;
  for (std::size_t p = 0; p < n; ++p) {
    running += own[p] - unknown[p];
    if (p == 0 || running > highest) {
      highest = running;
      found.peak = static_cast<std::int64_t>(p);
    }
  }
  found.positions = samples(n, max_points, found.peak);
  found.series.assign(groups, std::vector<Wide>(found.positions.size(), 0));
  std::vector<Wide> live(groups, 0);
  Wide freed = 0;
  std::size_t next = 0;
  for (std::size_t p = 0; p < n && next < found.positions.size(); ++p) {
    // An allocation's group, or a matched free's allocation's.
    const std::int64_t of = is_alloc[p] != 0 ? group[p] : alloc_of[p] >= 0 ? group[at(alloc_of[p])] : -1;
    if (of >= 0 && at(of) < groups) live[at(of)] += own[p];
    freed += unknown[p];
    if (static_cast<std::int64_t>(p) == found.positions[next]) {
      for (std::size_t k = 0; k < groups; ++k) found.series[k][next] = live[k];
      found.unknown_freed.push_back(freed);
      ++next;
    }
  }
  return found;
}

LiveAt live_at(std::span<const std::uint8_t> is_alloc, std::span<const std::int64_t> end,
               std::span<const std::int64_t> size, std::span<const std::int64_t> group, std::size_t groups,
               std::int64_t position) {
  const std::size_t n = is_alloc.size();
  STOWAGE_CHECK(end.size() == n && size.size() == n && group.size() == n, "is_alloc (", n,
                "), end, size and group must have one entry a position");
  STOWAGE_CHECK(position < static_cast<std::int64_t>(n), "position ", position, " is beyond the ", n, " positions");
  LiveAt found{std::vector<Wide>(groups, 0), std::vector<std::int64_t>(groups, 0)};
  for (std::int64_t p = 0; p <= position; ++p) {
    if (is_alloc[at(p)] == 0 || end[at(p)] <= position) continue;
    const std::int64_t of = group[at(p)];
    STOWAGE_CHECK(of >= 0 && at(of) < groups, "allocation ", p, " has group ", of, ", outside 0..", groups - 1);
    found.bytes[at(of)] += size[at(p)];
    ++found.count[at(of)];
  }
  return found;
}

std::vector<Growing> growing_groups(std::span<const std::uint8_t> is_alloc, std::span<const std::int64_t> end,
                                    std::span<const std::int64_t> size, std::span<const std::int64_t> group,
                                    std::span<const std::int64_t> first, std::span<const std::int64_t> positions) {
  const std::size_t groups = first.size();
  std::vector<LiveAt> at_ends;
  for (const std::int64_t position : positions) {
    STOWAGE_CHECK(position >= -1, "position ", position, " is before the trace");
    at_ends.push_back(position < 0 ? LiveAt{std::vector<Wide>(groups, 0), std::vector<std::int64_t>(groups, 0)}
                                   : live_at(is_alloc, end, size, group, groups, position));
  }
  std::vector<Growing> found;
  if (at_ends.size() < 2) return found;
  std::vector<std::size_t> present;
  for (std::size_t g = 0; g < groups; ++g) {
    if (at_ends.back().count[g] != 0) present.push_back(g);
  }
  std::stable_sort(present.begin(), present.end(), [&](std::size_t a, std::size_t b) { return first[a] < first[b]; });
  for (const std::size_t g : present) {
    bool grew = true;
    for (std::size_t k = 1; k < at_ends.size() && grew; ++k) grew = at_ends[k].bytes[g] > at_ends[k - 1].bytes[g];
    if (!grew) continue;
    const auto steps = static_cast<std::int64_t>(at_ends.size());
    found.push_back({static_cast<std::int64_t>(g), (at_ends.back().bytes[g] - at_ends.front().bytes[g]) / (steps - 1),
                     steps});
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const Growing& a, const Growing& b) { return a.bytes_per_step > b.bytes_per_step; });
  return found;
}

}  // namespace stowage::snapshot
