#include "snapshot/peak_estimates.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "base/errors.hpp"

namespace stowage::snapshot {

namespace {

using Change = std::vector<Wide>;  // n + 1 entries: the last takes what happens after the trace

std::size_t at(std::int64_t position) { return static_cast<std::size_t>(position); }

Wide peak_with(const LiveSeries& live, std::span<const Wide> change) {
  Wide running = 0;
  Wide best = 0;
  for (std::size_t i = 0; i < live.size(); ++i) {
    running += change[i];
    const Wide value = live[i] + running;
    if (i == 0 || value > best) best = value;
  }
  return best;
}

// Checks the arguments every estimate takes; n is the series' length.
void check_common(std::size_t n, Positions end, std::span<const std::int64_t> size) {
  STOWAGE_CHECK(end.size() == n && size.size() == n, "the live series (", n, " positions), `end` (", end.size(),
                ") and `size` (", size.size(), ") must have one entry a position");
  check_positions(end, static_cast<std::int64_t>(n), "end", false);
}

// The position where the step holding a position ends (the next step's start; n for the last),
// for positions searched in turn (NumpySearch: `step_starts` may be out of order).
class StepEnds {
 public:
  StepEnds(Positions step_starts, std::size_t n) : starts_(step_starts), search_(step_starts, true), n_(n) {}
  std::int64_t next(std::int64_t position) {
    const std::size_t following = search_.next(position);
    return following < starts_.size() ? starts_[following] : static_cast<std::int64_t>(n_);
  }

 private:
  Positions starts_;
  NumpySearch search_;
  std::size_t n_;
};

std::int64_t step_end(Positions step_starts, std::int64_t position, std::size_t n) {
  return StepEnds(step_starts, n).next(position);
}

}  // namespace

Wide changed_peak_wide(const LiveSeries& live, std::span<const Wide> change) {
  STOWAGE_CHECK(change.size() >= live.size(), "the change (", change.size(), " entries) is shorter than the series (",
                live.size(), ")");
  return peak_with(live, change);
}

Wide changed_peak(const LiveSeries& live, std::span<const std::int64_t> change) {
  STOWAGE_CHECK(change.size() == live.size(), "the change (", change.size(), " entries) and the live series (",
                live.size(), ") must have one entry a position");
  Change wide(change.size() + 1, 0);
  std::copy(change.begin(), change.end(), wide.begin());
  return peak_with(live, wide);
}

Wide removed_peak(const LiveSeries& live, Positions end, std::span<const std::int64_t> size, Positions removed) {
  const std::size_t n = live.size();
  check_common(n, end, size);
  check_positions(removed, static_cast<std::int64_t>(n) - 1, "removed", false);
  Change change(n + 1, 0);
  for (const std::int64_t p : removed) {
    change[at(p)] -= size[at(p)];
    change[at(end[at(p)])] += size[at(p)];  // (at n when never freed: after the series)
  }
  return peak_with(live, change);
}

Wide freed_when_made_peak(const LiveSeries& live, Positions end, std::span<const std::int64_t> size, Positions kept,
                          Positions backward_allocs, Positions step_starts) {
  const std::size_t n = live.size();
  check_common(n, end, size);
  check_positions(kept, static_cast<std::int64_t>(n) - 1, "kept", false);
  check_positions(backward_allocs, static_cast<std::int64_t>(n), "backward_allocs", true);
  check_positions(step_starts, static_cast<std::int64_t>(n), "step_starts", false);
  const std::size_t k = kept.size();
  std::vector<std::size_t> group(k);
  for (std::size_t i = 0; i < k; ++i) group[i] = lower_index(backward_allocs, kept[i]);
  std::vector<std::int64_t> early(k);
  if (k > 0 && group.front() != group.back()) {
    // Split by backward: freed just after the last of its run of one group is made.
    std::int64_t last = 0;
    for (std::size_t i = k; i-- > 0;) {
      if (i == k - 1 || group[i] != group[i + 1]) last = kept[i];
      early[i] = last + 1;
    }
  } else {
    StepEnds ends(step_starts, n);
    for (std::size_t i = 0; i < k; ++i) early[i] = ends.next(kept[i]);
  }
  Change change(n + 1, 0);
  for (std::size_t i = 0; i < k; ++i) {
    const std::size_t p = at(kept[i]);
    change[at(std::min(early[i], end[p]))] -= size[p];
    change[at(end[p])] += size[p];
  }
  return peak_with(live, change);
}

namespace {

// Backward's allocations by step: `first[s]` the index in backward_allocs of step s's first
// (s = 0 .. steps), `count[s]` how many (as numpy finds them: signed where step_starts are out
// of order).
struct BackwardBySteps {
  std::vector<std::int64_t> first, count;
};

BackwardBySteps backward_by_steps(Positions backward_allocs, Positions step_starts) {
  std::vector<std::int64_t> step_of(backward_allocs.size());
  NumpySearch by_step(step_starts, true);
  for (std::size_t j = 0; j < step_of.size(); ++j) {
    step_of[j] = static_cast<std::int64_t>(by_step.next(backward_allocs[j]));
  }
  const std::size_t steps = step_starts.size() + 1;
  BackwardBySteps found{std::vector<std::int64_t>(steps), std::vector<std::int64_t>(steps)};
  NumpySearch first_of(step_of, false);
  for (std::size_t s = 0; s < steps; ++s) {
    found.first[s] = static_cast<std::int64_t>(first_of.next(static_cast<std::int64_t>(s)));
  }
  for (std::size_t s = 0; s < steps; ++s) {
    const std::int64_t next = s + 1 < steps ? found.first[s + 1] : static_cast<std::int64_t>(backward_allocs.size());
    found.count[s] = next - found.first[s];
  }
  return found;
}

}  // namespace

Wide grads_set_to_none_peak(const LiveSeries& live, std::span<const std::uint8_t> is_alloc, Positions end,
                            std::span<const std::int64_t> size, Positions kept, Positions backward_allocs,
                            Positions step_starts) {
  const std::size_t n = live.size();
  check_common(n, end, size);
  STOWAGE_CHECK(is_alloc.size() == n, "is_alloc (", is_alloc.size(), ") must have one entry a position (", n, ")");
  check_positions(kept, static_cast<std::int64_t>(n) - 1, "kept", false);
  check_positions(backward_allocs, static_cast<std::int64_t>(n) - 1, "backward_allocs", true);
  check_positions(step_starts, static_cast<std::int64_t>(n), "step_starts", false);
  Change change(n + 1, 0);
  StepEnds own_ends(step_starts, n);
  for (const std::int64_t g : kept) {  // the kept gradients, gone when their own step ends ...
    change[at(std::min(own_ends.next(g), end[at(g)]))] -= size[at(g)];
    change[at(end[at(g)])] += size[at(g)];
  }
  std::vector<std::int64_t> allocs;
  for (std::size_t p = 0; p < n; ++p) {
    if (is_alloc[p] != 0) allocs.push_back(static_cast<std::int64_t>(p));
  }
  const auto rank = [&](std::int64_t position) { return static_cast<std::int64_t>(lower_index(allocs, position)); };
  const BackwardBySteps backward = backward_by_steps(backward_allocs, step_starts);
  const auto first_backward = [&](std::size_t step) {
    const std::int64_t first = backward.first[step];
    STOWAGE_CHECK(first < static_cast<std::int64_t>(backward_allocs.size()), "step_starts out of order leave step ",
                  step, " no backward allocation to find gradients by");
    return backward_allocs[at(first)];
  };
  for (const std::int64_t g : kept) {
    const std::int64_t s = size[at(g)];
    const std::size_t own_step = upper_index(step_starts, g);
    if (backward.count[own_step] == 0) continue;
    const std::int64_t ordinal = rank(g) - rank(first_backward(own_step));
    if (ordinal < 0) continue;  // (made before its step's backward: nothing to find it by)
    const std::size_t last_step = upper_index(step_starts, std::min(end[at(g)], static_cast<std::int64_t>(n) - 1));
    for (std::size_t step = own_step + 1; step <= last_step; ++step) {
      if (backward.count[step] == 0) continue;
      const std::int64_t found = rank(first_backward(step)) + ordinal;
      if (found >= static_cast<std::int64_t>(allocs.size())) break;
      const std::int64_t t = allocs[at(found)];
      const std::int64_t its_step_end = step_end(step_starts, t, n);
      if (size[at(t)] != s || end[at(t)] >= its_step_end) continue;
      change[at(end[at(t)])] += s;  // ... and each step's own gradient kept to the step's end
      change[at(its_step_end)] -= s;
    }
  }
  return peak_with(live, change);
}

}  // namespace stowage::snapshot
