#include "snapshot/trace_steps.hpp"

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>

#include "base/errors.hpp"

namespace stowage::snapshot {

namespace {

std::size_t at(std::int64_t position) { return static_cast<std::size_t>(position); }

double pairwise_sum(const std::int64_t* values, std::size_t n) {  // numpy's pairwise_sum
  if (n < 8) {
    double sum = 0.;
    for (std::size_t i = 0; i < n; ++i) sum += static_cast<double>(values[i]);
    return sum;
  }
  if (n <= 128) {
    double r[8];
    for (std::size_t j = 0; j < 8; ++j) r[j] = static_cast<double>(values[j]);
    std::size_t i = 8;
    for (; i < n - n % 8; i += 8) {
      for (std::size_t j = 0; j < 8; ++j) r[j] += static_cast<double>(values[i + j]);
    }
    double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += static_cast<double>(values[i]);
    return sum;
  }
  std::size_t half = n / 2;
  half -= half % 8;
  return pairwise_sum(values, half) + pairwise_sum(values + half, n - half);
}

// The periods to try: where the largest size of the stretch after a quarter in recurs, and
// where the size a quarter in recurs, within half of what follows; ascending, each once.
std::vector<std::size_t> candidate_periods(std::span<const std::int64_t> tail) {
  const std::size_t half = tail.size() / 2;
  const std::size_t anchor = half == 0 ? 0
      : static_cast<std::size_t>(std::max_element(tail.begin(), tail.begin() + static_cast<std::ptrdiff_t>(half)) -
                                 tail.begin());  // the first of the largest: it recurs once a step
  std::set<std::size_t> found;
  const auto recurring = [&](std::size_t from) {
    std::size_t taken = 0;
    for (std::size_t j = from + kMinPeriod; j < std::min(from + half + 1, tail.size()) && taken < kMaxCandidates; ++j) {
      if (tail[j] == tail[from]) {
        found.insert(j - from);
        ++taken;
      }
    }
  };
  recurring(anchor);
  recurring(0);
  return {found.begin(), found.end()};
}

// The first allocation of the period's most frequent size (the smallest such size on a tie).
std::size_t first_of_commonest(std::span<const std::int64_t> period) {
  std::map<std::int64_t, std::size_t> counts;
  for (const std::int64_t size : period) ++counts[size];
  auto commonest = counts.begin();
  for (auto it = counts.begin(); it != counts.end(); ++it) {
    if (it->second > commonest->second) commonest = it;
  }
  return static_cast<std::size_t>(std::find(period.begin(), period.end(), commonest->first) - period.begin());
}

// Whether live bytes at a period's starts grow as a leaking step's do: by about the same amount
// each time, a small part of what a period allocates (a layer's repetition in forward keeps
// most of what it makes).
bool leaking(const std::vector<Wide>& levels, double allocated, bool exact) {
  if (levels.size() < 3) return false;
  Wide low = levels[1] - levels[0];
  Wide high = low;
  for (std::size_t i = 2; i < levels.size(); ++i) {
    low = std::min(low, levels[i] - levels[i - 1]);
    high = std::max(high, levels[i] - levels[i - 1]);
  }
  if (low <= 0) return false;
  return at_most(high - low, kLeakAlike * static_cast<double>(high), exact) &&
         at_most(high, kLeakShare * allocated, exact);
}

}  // namespace

double numpy_float_sum(std::span<const std::int64_t> values) {
  constexpr std::size_t kBuffer = 8192;  // numpy's buffer: the values cast to float64 a buffer at a time
  double sum = 0.;
  for (std::size_t start = 0; start < values.size(); start += kBuffer) {
    sum += pairwise_sum(values.data() + start, std::min(kBuffer, values.size() - start));
  }
  return sum;
}

std::optional<std::pair<std::int64_t, std::int64_t>> repeating_period(std::span<const std::int64_t> sizes,
                                                                      std::span<const Wide> alloc_live, bool exact) {
  STOWAGE_CHECK(sizes.size() == alloc_live.size(), "sizes (", sizes.size(), ") and live bytes (", alloc_live.size(),
                ") must have one entry an allocation");
  const std::span<const std::int64_t> tail = sizes.subspan(sizes.size() / 4);
  if (tail.empty()) return std::nullopt;
  for (const std::size_t period : candidate_periods(tail)) {
    std::size_t same = 0;
    for (std::size_t i = 0; i + period < tail.size(); ++i) same += tail[i] == tail[i + period] ? 1U : 0U;
    if (static_cast<double>(same) / static_cast<double>(tail.size() - period) < kRepeat) continue;
    const std::size_t first = first_of_commonest(sizes.first(period));
    std::vector<Wide> levels;
    for (std::size_t i = first + period; i < alloc_live.size(); i += period) levels.push_back(alloc_live[i]);
    const auto result = std::make_pair(static_cast<std::int64_t>(period), static_cast<std::int64_t>(first));
    if (levels.size() >= 2) {
      const auto [low, high] = std::minmax_element(levels.begin(), levels.end());
      if (at_most(*high - *low, kSameLevel * static_cast<double>(std::max(*high, Wide{1})), exact)) return result;
    }
    if (leaking(levels, numpy_float_sum(sizes.subspan(first, period)), exact)) return result;
  }
  return std::nullopt;
}

std::vector<std::uint8_t> in_trial(const StepMarks& marks, std::span<const std::int64_t> index) {
  std::vector<std::pair<std::int64_t, std::int64_t>> inside;  // [first, last] event indexes
  for (const std::int64_t begin : marks.trial_begins) {
    const std::size_t next = upper_index(marks.trial_ends, begin);
    const std::int64_t end = next < marks.trial_ends.size() ? marks.trial_ends[next] : marks.events;
    if (end - begin >= 2) inside.emplace_back(begin + 1, end - 1);
  }
  std::sort(inside.begin(), inside.end());
  std::vector<std::pair<std::int64_t, std::int64_t>> merged;
  for (const auto& span : inside) {
    if (!merged.empty() && span.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, span.second);
    } else {
      merged.push_back(span);
    }
  }
  std::vector<std::uint8_t> found(index.size(), 0);
  for (std::size_t i = 0; i < index.size(); ++i) {
    const auto after = std::upper_bound(merged.begin(), merged.end(), index[i],
                                        [](std::int64_t value, const auto& span) { return value < span.first; });
    found[i] = after != merged.begin() && index[i] <= std::prev(after)->second ? 1 : 0;
  }
  return found;
}

namespace {

// The event indexes where steps end, and how they were found.
std::pair<std::vector<std::int64_t>, std::string> step_ends(const StepMarks& marks, std::span<const std::int64_t> index,
                                                            const LiveSeries& live,
                                                            std::span<const std::int64_t> alloc_positions,
                                                            std::span<const std::int64_t> size) {
  if (!marks.steps.empty()) {  // fit's trial spans are steps of their own
    std::set<std::int64_t> ends(marks.steps.begin(), marks.steps.end());
    for (const std::int64_t begin : marks.trial_begins) {
      if (begin >= 1) ends.insert(begin - 1);
    }
    for (const std::int64_t end : marks.trial_ends) {
      if (end >= 0) ends.insert(end);
    }
    return {{ends.begin(), ends.end()}, "marks"};
  }
  if (alloc_positions.size() > 2 * kMinPeriod) {
    const std::span<const std::int64_t> window = alloc_positions.first(std::min(alloc_positions.size(), kPeriodWindow));
    std::vector<std::int64_t> sizes;
    std::vector<Wide> levels;
    for (const std::int64_t p : window) {
      sizes.push_back(size[at(p)]);
      levels.push_back(live[at(p)]);
    }
    if (const auto found = repeating_period(sizes, levels, live.wide())) {
      const auto [period, first] = *found;
      std::vector<std::int64_t> ends;
      for (std::size_t s = at(first + period); s < alloc_positions.size(); s += at(period)) {
        ends.push_back(index[at(alloc_positions[s])] - 1);
      }
      return {ends, "repeating allocations"};
    }
  }
  return {{}, ""};
}

Step step_of(std::span<const std::int64_t> index, const LiveSeries& live, std::size_t a, std::size_t b,
             bool fit_trial) {
  std::size_t highest = a;
  for (std::size_t p = a + 1; p < b; ++p) {
    if (live[p] > live[highest]) highest = p;
  }
  return Step{0, index[a], index[b - 1], live[highest], index[highest], live[b - 1], fit_trial};
}

void check_steps_arguments(const StepMarks& marks, std::span<const std::int64_t> index, const LiveSeries& live,
                           std::span<const std::uint8_t> is_alloc, std::span<const std::int64_t> size) {
  const std::size_t n = index.size();
  STOWAGE_CHECK(live.size() == n && is_alloc.size() == n && size.size() == n, "index (", n, "), live (", live.size(),
                "), is_alloc (", is_alloc.size(), ") and size (", size.size(), ") must have one entry a position");
  check_positions(index, marks.events > 0 ? marks.events - 1 : 0, "index", true);
  for (const auto* list : {&marks.steps, &marks.trial_begins, &marks.trial_ends}) {
    check_positions(*list, marks.events, "marks", true);
  }
}

}  // namespace

Steps cut_steps(const StepMarks& marks, std::span<const std::int64_t> index, const LiveSeries& live,
                std::span<const std::uint8_t> is_alloc, std::span<const std::int64_t> size) {
  check_steps_arguments(marks, index, live, is_alloc, size);
  std::vector<std::int64_t> allocs;
  for (std::size_t p = 0; p < is_alloc.size(); ++p) {
    if (is_alloc[p] != 0) allocs.push_back(static_cast<std::int64_t>(p));
  }
  auto [ends, found_by] = step_ends(marks, index, live, allocs, size);
  Steps found{{}, found_by};
  if (found_by.empty() || index.empty()) return found;
  const std::vector<std::uint8_t> trial = in_trial(marks, index);
  const bool by_marks = found_by == "marks";
  // Pieces end where steps end; with marks, what follows the last one is no step.
  std::vector<std::size_t> bounds{0};
  std::vector<bool> closes;
  for (const std::int64_t end : ends) {
    bounds.push_back(upper_index(index, end));
    closes.push_back(!by_marks || std::binary_search(marks.steps.begin(), marks.steps.end(), end));
  }
  bounds.push_back(index.size());
  closes.push_back(!by_marks);
  std::optional<std::size_t> start;
  for (std::size_t k = 0; k + 1 < bounds.size(); ++k) {
    const std::size_t a = bounds[k];
    const std::size_t b = bounds[k + 1];
    if (b <= a) continue;
    if (std::any_of(trial.begin() + static_cast<std::ptrdiff_t>(a), trial.begin() + static_cast<std::ptrdiff_t>(b),
                    [](std::uint8_t inside) { return inside != 0; })) {
      found.steps.push_back(step_of(index, live, a, b, true));
      continue;
    }
    if (!start) start = a;
    if (closes[k]) {
      found.steps.push_back(step_of(index, live, *start, b, false));
      start.reset();
    }
    if (found.steps.size() >= kMaxSteps) break;
  }
  for (std::size_t number = 0; number < found.steps.size(); ++number) {
    found.steps[number].number = static_cast<std::int64_t>(number);
  }
  return found;
}

}  // namespace stowage::snapshot
