#include "allocator/step_layout.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "base/errors.hpp"

namespace stowage {

namespace {

// [begin, end) on the line, end up to 2 x period: a lifetime across the boundary ends after it.
struct Span {
  std::size_t begin;
  std::size_t end;
};

Span unrolled(const Lifetime& lifetime, std::size_t period) noexcept {
  return {lifetime.start, lifetime.end > lifetime.start ? lifetime.end : lifetime.end + period};
}

bool intersect(Span a, Span b) noexcept { return a.begin < b.end && b.begin < a.end; }

}  // namespace

bool lifetimes_overlap(const Lifetime& a, const Lifetime& b, std::size_t period) noexcept {
  const Span x = unrolled(a, period);
  const Span y = unrolled(b, period);
  // Both spans start in [0, period) and are at most a period long, so on the cycle one can
  // meet the other only as itself or one period later.
  return intersect(x, y) || intersect(x, {y.begin + period, y.end + period}) ||
         intersect({x.begin + period, x.end + period}, y);
}

StepLayout lay_out_step(const std::vector<Lifetime>& lifetimes, std::size_t period) {
  STOWAGE_CHECK(period > 0, "a step layout needs a step of at least one tick");
  const std::size_t n = lifetimes.size();
  for (std::size_t i = 0; i < n; ++i) {
    const Lifetime& l = lifetimes[i];
    STOWAGE_CHECK(l.bytes > 0 && l.start < period && l.end <= period, "lifetime ", i,
                  " (bytes ", l.bytes, ", ticks ", l.start, " to ", l.end,
                  ") does not fit a step of ", period, " ticks");
  }
  StepLayout layout;
  layout.offsets.assign(n, 0);

  // The lower bound: the most bytes live at one tick, by a sweep over the unrolled cycle.
  {
    std::vector<std::pair<std::size_t, std::ptrdiff_t>> deltas;  // (tick, +bytes / -bytes)
    deltas.reserve(4 * n);
    for (const Lifetime& l : lifetimes) {
      const auto bytes = static_cast<std::ptrdiff_t>(l.bytes);
      if (l.end > l.start) {
        deltas.emplace_back(l.start, bytes);
        deltas.emplace_back(l.end, -bytes);
      } else {
        deltas.emplace_back(l.start, bytes);
        deltas.emplace_back(period, -bytes);
        if (l.end > 0) {
          deltas.emplace_back(0, bytes);
          deltas.emplace_back(l.end, -bytes);
        }
      }
    }
    // Frees before allocations at the same tick: a lifetime ending at t and one starting at t
    // do not overlap.
    std::sort(deltas.begin(), deltas.end());
    std::ptrdiff_t live = 0;
    for (const auto& [tick, delta] : deltas) {
      live += delta;
      layout.peak_live_bytes = std::max(layout.peak_live_bytes, static_cast<std::size_t>(live));
    }
  }

  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  auto length = [&](std::size_t i) {
    const Span s = unrolled(lifetimes[i], period);
    return s.end - s.begin;
  };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (lifetimes[a].bytes != lifetimes[b].bytes) return lifetimes[a].bytes > lifetimes[b].bytes;
    if (length(a) != length(b)) return length(a) > length(b);
    return a < b;
  });

  std::vector<std::size_t> placed;
  placed.reserve(n);
  std::vector<std::pair<std::size_t, std::size_t>> taken;  // [offset, end) of conflicting ones
  for (const std::size_t i : order) {
    const Lifetime& l = lifetimes[i];
    taken.clear();
    for (const std::size_t j : placed) {
      if (lifetimes_overlap(l, lifetimes[j], period)) {
        taken.emplace_back(layout.offsets[j], layout.offsets[j] + lifetimes[j].bytes);
      }
    }
    std::sort(taken.begin(), taken.end());
    std::size_t best = std::numeric_limits<std::size_t>::max();
    std::size_t best_gap = std::numeric_limits<std::size_t>::max();
    std::size_t top = 0;  // the end of what is taken below the current gap
    for (const auto& [begin, end] : taken) {
      if (begin > top && begin - top >= l.bytes && begin - top < best_gap) {
        best = top;
        best_gap = begin - top;
      }
      top = std::max(top, end);
    }
    layout.offsets[i] = best != std::numeric_limits<std::size_t>::max() ? best : top;
    layout.arena_bytes = std::max(layout.arena_bytes, layout.offsets[i] + l.bytes);
    placed.push_back(i);
  }
  return layout;
}

}  // namespace stowage
