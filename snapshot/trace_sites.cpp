#include "snapshot/trace_sites.hpp"

#include <algorithm>
#include <map>
#include <optional>

#include "base/errors.hpp"
#include "snapshot/live_pairs.hpp"

namespace stowage::snapshot {

LivePairs pair_trace(std::span<const std::uint8_t> action, std::span<const std::uint64_t> addr,
                     std::span<const std::uint64_t> size) {
  const std::size_t n = count_positions(action);
  LivePairs pairs{std::vector<std::int64_t>(n), std::vector<std::uint8_t>(n), std::vector<std::int64_t>(n),
                  std::vector<std::int64_t>(n),  std::vector<std::int64_t>(n), std::vector<std::int64_t>(n),
                  std::vector<std::int64_t>(n)};
  pair_allocations<std::int64_t>(action, addr, size,
                                 {pairs.index, pairs.is_alloc, pairs.size, pairs.own, pairs.unknown, pairs.alloc_of,
                                  pairs.end});
  return pairs;
}

TraceSites name_sites(std::span<const std::int32_t> stack, std::span<const std::vector<Frame>> stacks,
                      std::span<const std::uint64_t> size, const LivePairs& pairs) {
  const std::size_t n = pairs.index.size();
  TraceSites sites{{}, std::vector<std::int64_t>(n, -1), {}};
  std::map<std::string, std::int64_t> ids;
  const auto id_of = [&](std::string name) {
    const auto [found, added] = ids.try_emplace(name, static_cast<std::int64_t>(sites.names.size()));
    if (added) sites.names.push_back(std::move(name));
    return found->second;
  };
  std::vector<std::optional<std::int64_t>> by_stack(stacks.size());  // a stack's site, where it names one
  std::vector<std::uint8_t> used(stacks.size(), 0);
  for (std::size_t p = 0; p < n; ++p) {
    if (pairs.is_alloc[p] == 0) continue;
    const std::int32_t s = stack[static_cast<std::size_t>(pairs.index[p])];
    STOWAGE_CHECK(s < static_cast<std::int64_t>(stacks.size()), "stack ", s, " is beyond the ", stacks.size(),
                  " stacks");
    if (s >= 0) used[static_cast<std::size_t>(s)] = 1;
  }
  for (std::size_t s = 0; s < stacks.size(); ++s) {
    if (used[s] == 0) continue;
    std::optional<std::string> name = frame_site(stacks[s]);
    if (name) by_stack[s] = id_of(std::move(*name));
  }
  std::map<std::int64_t, std::vector<std::size_t>> by_class;  // the positions named by their size class
  for (std::size_t p = 0; p < n; ++p) {
    if (pairs.is_alloc[p] == 0) continue;
    const auto event = static_cast<std::size_t>(pairs.index[p]);
    const std::int32_t s = stack[event];
    if (s >= 0 && by_stack[static_cast<std::size_t>(s)]) {
      sites.of[p] = *by_stack[static_cast<std::size_t>(s)];
    } else {
      by_class[size_class_number(size[event])].push_back(p);
    }
  }
  for (const auto& [number, positions] : by_class) {
    const std::int64_t id = id_of(size_class_name(number));
    for (const std::size_t p : positions) sites.of[p] = id;
  }
  sites.first.assign(sites.names.size(), static_cast<std::int64_t>(n));
  for (std::size_t p = 0; p < n; ++p) {
    if (sites.of[p] < 0) continue;
    auto& first = sites.first[static_cast<std::size_t>(sites.of[p])];
    first = std::min(first, static_cast<std::int64_t>(p));
  }
  return sites;
}

}  // namespace stowage::snapshot
