#include "snapshot/tag_resolution.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

namespace stowage {

namespace {

// The innermost span open at `position`: the last to begin at or before it, then up its parents
// while the span ended at or before it; -1 when none.
std::int64_t innermost_span(const std::vector<ModuleSpan>& spans, std::int64_t position) {
  const auto after = std::upper_bound(spans.begin(), spans.end(), position,
                                      [](std::int64_t at, const ModuleSpan& span) { return at < span[0]; });
  auto span = static_cast<std::int64_t>(after - spans.begin()) - 1;
  while (span >= 0) {
    const std::int64_t end = spans[static_cast<std::size_t>(span)][1];
    if (end < 0 || end > position) {
      break;
    }
    span = spans[static_cast<std::size_t>(span)][3];
  }
  return span;
}

// For each note, the index of the latest allocation at its address before its position; -1
// where none.
std::vector<std::int64_t> latest_before(const std::vector<std::int64_t>& positions,
                                        const std::vector<std::uint64_t>& addresses,
                                        const std::vector<TagNote>& notes) {
  std::vector<std::size_t> order(positions.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::pair(addresses[a], positions[a]) < std::pair(addresses[b], positions[b]);
  });
  std::vector<std::int64_t> found(notes.size(), -1);
  for (std::size_t n = 0; n < notes.size(); ++n) {
    const std::pair wanted(notes[n].address, std::max<std::int64_t>(notes[n].position, 0));
    const auto first_not_before = std::lower_bound(order.begin(), order.end(), wanted, [&](std::size_t a, const auto& key) {
      return std::pair(addresses[a], positions[a]) < key;
    });
    if (first_not_before != order.begin() && addresses[*std::prev(first_not_before)] == notes[n].address) {
      found[n] = static_cast<std::int64_t>(*std::prev(first_not_before));
    }
  }
  return found;
}

}  // namespace

ResolvedTags resolve_tags(const std::vector<std::int64_t>& positions, const std::vector<std::uint64_t>& addresses,
                          const std::vector<TagNote>& notes, const std::vector<ModuleSpan>& spans,
                          std::int64_t num_categories) {
  const std::size_t count = positions.size();
  std::vector<std::int64_t> category(count, num_categories);
  std::vector<std::int64_t> module(count, 0);
  for (std::size_t a = 0; a < count; ++a) {
    const std::int64_t span = innermost_span(spans, positions[a]);
    module[a] = span >= 0 ? spans[static_cast<std::size_t>(span)][2] : 0;
  }
  const std::vector<std::int64_t> at = latest_before(positions, addresses, notes);
  for (std::size_t n = 0; n < notes.size(); ++n) {
    if (at[n] < 0) {
      continue;
    }
    const auto a = static_cast<std::size_t>(at[n]);
    category[a] = std::min(category[a], notes[n].category);
    if (notes[n].owner >= 0) {
      module[a] = notes[n].owner;
    }
  }
  ResolvedTags out;
  for (std::size_t a = 0; a < count; ++a) {
    if (category[a] < num_categories || module[a] > 0) {
      out.allocation.push_back(static_cast<std::int64_t>(a));
      out.category.push_back(category[a] < num_categories ? category[a] : -1);
      out.module.push_back(module[a]);
    }
  }
  return out;
}

}  // namespace stowage
