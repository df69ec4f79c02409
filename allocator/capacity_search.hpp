// The smallest device on which a replay completes: a search over capacities in fixed steps.
//
// `fits(capacity)` replays a trace on a device of that many bytes and says whether it completed.
// The search starts above the trace's peak of requested bytes (below it nothing fits), or at a
// capacity already seen to fit (`known_fit`), doubles until a capacity fits (giving up at
// `max_capacity`), bisects, and then verifies both sides: the capacity found fits, and one step
// below it does not. An allocator need not be monotone in capacity (a larger device can split
// blocks differently and fragment worse), so a replay that fits below the bisection's answer is
// followed down, a step at a time, until one does not; `verified` says both checks held.
//
// `replays` counts the bisection's replays, the walk down's and the two verifying ones (the
// doubling's are not counted), as `stowage replay --min-capacity` has always reported it.
//
// Contract: a pure function of `fits`; it calls `fits` on multiples of `step` only (no larger than
// `max_capacity`, but for the rounded-up `known_fit`), and `progress(done, total)` once before the bisection and after each of
// its replays. Neither callback may throw through the search except to abandon it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

namespace stowage {

struct CapacitySearchResult {
  std::optional<std::uint64_t> min_capacity;  // none: nothing up to max_capacity fits
  bool verified = false;
  std::uint64_t replays = 0;
};

struct CapacitySearchLimits {
  std::uint64_t step = std::uint64_t{2} << 20;          // 2 MiB: the allocator's page
  std::uint64_t max_capacity = std::uint64_t{16} << 40;  // the simulated device's largest
};

CapacitySearchResult search_min_capacity(
    const std::function<bool(std::uint64_t capacity)>& fits, std::uint64_t peak_requested,
    std::optional<std::uint64_t> known_fit, const CapacitySearchLimits& limits = {},
    const std::function<void(std::uint64_t done, std::uint64_t total)>& progress = {});

}  // namespace stowage
