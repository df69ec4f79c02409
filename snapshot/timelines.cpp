#include "snapshot/timelines.hpp"

#include <algorithm>
#include <map>
#include <numeric>

#include "snapshot/categories.hpp"
#include "snapshot/live_groups.hpp"
#include "snapshot/trace_findings.hpp"

namespace stowage::snapshot {

namespace {

std::size_t at(std::int64_t value) { return static_cast<std::size_t>(value); }

Timeline grouped(const TimelineInputs& inputs, std::span<const std::int64_t> group, std::vector<std::string> names) {
  Timeline out;
  const LivePairs& pairs = inputs.pairs;
  if (pairs.index.empty()) return out;
  GroupedLive found = grouped_live(pairs.own, pairs.unknown, pairs.is_alloc, pairs.alloc_of, group, names.size(),
                                   kMaxPoints);
  for (const std::int64_t p : found.positions) out.x.push_back(pairs.index[at(p)]);
  if (inputs.baseline != 0) {
    std::vector<Wide> before;
    for (const Wide freed : found.unknown_freed) before.push_back(std::max(inputs.baseline - freed, Wide{0}));
    out.series.emplace_back(kBeforeTrace, std::move(before));
  }
  for (std::size_t k = 0; k < names.size(); ++k) out.series.emplace_back(std::move(names[k]), std::move(found.series[k]));
  out.peak_index = pairs.index[at(found.peak)];
  return out;
}

void keep_series_with_bytes(Timeline& timeline) {
  std::erase_if(timeline.series, [](const auto& named) {
    return std::all_of(named.second.begin(), named.second.end(), [](Wide value) { return value == 0; });
  });
}

Timeline by_site(const TimelineInputs& inputs) {
  std::vector<std::string> names;
  std::map<std::int64_t, std::int64_t> shown;  // a site's series
  for (const SiteLive& row : inputs.peak_sites) {
    if (names.size() == kTimelineSites || row.site.starts_with("(")) continue;
    const auto site = std::find(inputs.sites.names.begin(), inputs.sites.names.end(), row.site);
    shown[site - inputs.sites.names.begin()] = static_cast<std::int64_t>(names.size());
    names.push_back(row.site);
  }
  std::vector<std::int64_t> group(inputs.pairs.index.size(), -1);
  for (std::size_t p = 0; p < group.size(); ++p) {
    if (inputs.sites.of[p] < 0) continue;
    const auto found = shown.find(inputs.sites.of[p]);
    group[p] = found != shown.end() ? found->second : static_cast<std::int64_t>(names.size());
  }
  names.emplace_back("other");
  return grouped(inputs, group, std::move(names));
}

Timeline by_category(const TimelineInputs& inputs) {
  const std::vector<std::int64_t> group(inputs.category.begin(), inputs.category.end());
  Timeline out = grouped(inputs, group, {std::begin(kCategoryNames), std::end(kCategoryNames)});
  keep_series_with_bytes(out);
  return out;
}

// The path's first `depth` names.
std::string prefix(const std::string& path, std::size_t depth) {
  std::size_t dots = 0;
  for (std::size_t k = 0; k < path.size(); ++k) {
    if (path[k] == '.' && ++dots == depth) return path.substr(0, k);
  }
  return path;
}

Timeline by_module(const TimelineInputs& inputs) {
  std::vector<std::string> group_names;
  for (std::size_t k = 0; k < inputs.paths.size(); ++k) {
    const std::int64_t block = inputs.block_of_path[k];
    group_names.push_back(block >= 0 ? inputs.blocks[at(block)] : prefix(inputs.paths[k], 3));
  }
  group_names.at(0) = "(outside any module's forward)";
  std::vector<std::string> distinct = group_names;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::vector<std::int64_t> of_path;
  for (const std::string& name : group_names) {
    of_path.push_back(std::lower_bound(distinct.begin(), distinct.end(), name) - distinct.begin());
  }
  const LivePairs& pairs = inputs.pairs;
  std::vector<double> made(distinct.size(), 0.0);
  for (std::size_t p = 0; p < pairs.index.size(); ++p) {
    if (pairs.is_alloc[p] != 0) made[at(of_path[at(inputs.module[p])])] += static_cast<double>(pairs.size[p]);
  }
  std::vector<std::size_t> order(distinct.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return made[a] > made[b]; });
  std::vector<std::int64_t> remap(distinct.size(), -1);
  std::vector<std::string> names;
  for (std::size_t k = 0; k < std::min(order.size(), kTimelineSites); ++k) {
    if (made[order[k]] <= 0) continue;
    remap[order[k]] = static_cast<std::int64_t>(names.size());
    names.push_back(distinct[order[k]]);
  }
  for (std::int64_t& series : remap) {
    if (series < 0) series = static_cast<std::int64_t>(names.size());
  }
  std::vector<std::int64_t> group(pairs.index.size());
  for (std::size_t p = 0; p < group.size(); ++p) group[p] = remap[at(of_path[at(inputs.module[p])])];
  names.emplace_back("other modules");
  Timeline out = grouped(inputs, group, std::move(names));
  keep_series_with_bytes(out);
  return out;
}

}  // namespace

Timelines timelines_of(const TimelineInputs& inputs) {
  Timelines out{by_site(inputs), by_category(inputs), std::nullopt};
  if (!inputs.paths.empty()) out.by_module = by_module(inputs);
  return out;
}

}  // namespace stowage::snapshot
