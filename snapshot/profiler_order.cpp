#include "snapshot/profiler_order.hpp"

#include <algorithm>
#include <numeric>

#include "base/errors.hpp"
#include "snapshot/live_series.hpp"

namespace stowage::snapshot {

std::vector<std::size_t> profiler_order(std::span<const std::int64_t> time_ns, std::span<const std::int64_t> size,
                                        std::span<const std::int64_t> total_after) {
  STOWAGE_CHECK(size.size() == time_ns.size() && total_after.size() == time_ns.size(), "the columns time_ns (",
                time_ns.size(), "), size (", size.size(), ") and total_after (", total_after.size(),
                ") must have one entry an event");
  std::vector<std::size_t> by_time(time_ns.size());
  std::iota(by_time.begin(), by_time.end(), std::size_t{0});
  std::stable_sort(by_time.begin(), by_time.end(), [&](std::size_t a, std::size_t b) { return time_ns[a] < time_ns[b]; });
  const auto before = [&](std::size_t e) { return Wide{total_after[e]} - size[e]; };  // the total before it
  std::vector<std::size_t> ordered;
  ordered.reserve(by_time.size());
  Wide running = by_time.empty() ? 0 : before(by_time.front());
  for (std::size_t i = 0; i < by_time.size();) {
    std::size_t j = i;
    while (j < by_time.size() && time_ns[by_time[j]] == time_ns[by_time[i]]) ++j;
    std::vector<std::size_t> group(by_time.begin() + static_cast<std::ptrdiff_t>(i),
                                   by_time.begin() + static_cast<std::ptrdiff_t>(j));
    while (!group.empty()) {
      auto pick = std::find_if(group.begin(), group.end(), [&](std::size_t e) { return before(e) == running; });
      if (pick == group.end()) pick = group.begin();
      ordered.push_back(*pick);
      running = total_after[*pick];
      group.erase(pick);
    }
    i = j;
  }
  return ordered;
}

namespace {

std::int64_t microseconds(std::int64_t ns) { return ns / 1000 - (ns % 1000 < 0 ? 1 : 0); }  // as Python's //

}  // namespace

std::vector<ProfiledEvent> profiled_trace(std::span<const std::int64_t> time_ns, std::span<const std::uint64_t> address,
                                          std::span<const std::int64_t> size, std::span<const std::int64_t> total_after,
                                          std::vector<std::int64_t> marks) {
  STOWAGE_CHECK(address.size() == time_ns.size(), "the columns time_ns (", time_ns.size(), ") and address (",
                address.size(), ") must have one entry an event");
  std::sort(marks.begin(), marks.end());
  std::vector<ProfiledEvent> trace;
  trace.reserve(2 * time_ns.size() + marks.size());
  std::size_t next_mark = 0;
  const auto mark = [&trace](std::int64_t ns) {
    trace.push_back({ProfiledEvent::Kind::kStepEnd, 0, 0, microseconds(ns)});
  };
  for (const std::size_t e : profiler_order(time_ns, size, total_after)) {
    for (; next_mark < marks.size() && marks[next_mark] <= time_ns[e]; ++next_mark) mark(marks[next_mark]);
    const std::uint64_t bytes = size[e] < 0 ? 0 - static_cast<std::uint64_t>(size[e]) : static_cast<std::uint64_t>(size[e]);
    const std::int64_t time_us = microseconds(time_ns[e]);
    if (size[e] > 0) {
      trace.push_back({ProfiledEvent::Kind::kAlloc, address[e], bytes, time_us});
    } else {
      trace.push_back({ProfiledEvent::Kind::kFreeRequested, address[e], bytes, time_us});
      trace.push_back({ProfiledEvent::Kind::kFreeCompleted, address[e], bytes, time_us});
    }
  }
  for (; next_mark < marks.size(); ++next_mark) mark(marks[next_mark]);
  return trace;
}

}  // namespace stowage::snapshot
