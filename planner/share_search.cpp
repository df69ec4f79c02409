#include "planner/share_search.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "base/errors.hpp"

namespace stowage::planner {

namespace {

std::int64_t ceil_div(std::int64_t value, std::int64_t divisor) { return (value + divisor - 1) / divisor; }

// One share's options by micro-batch rows, each evaluated once.
class ShareWeighing {
 public:
  ShareWeighing(double fraction, const ShareSearch& search, const EvaluateOption& evaluate)
      : fraction_(fraction), search_(search), evaluate_(evaluate) {}

  const WeighedOption& at(std::int64_t micro_rows) {
    auto found = solved_.find(micro_rows);
    if (found == solved_.end()) {
      const WeighedOption option = evaluate_(fraction_, micro_rows, ceil_div(search_.rows, micro_rows));
      found = solved_.emplace(micro_rows, option).first;
    }
    return found->second;
  }

  // The most rows a micro-batch fits at, down to `smallest`; nullopt when none does.
  std::optional<std::int64_t> largest_fitting() {
    const std::int64_t most = search_.rows / search_.smallest;  // micro-batches of at least `smallest` rows
    if (at(search_.rows).feasible) {
      return search_.rows;
    }
    if (most < 2 || !at(ceil_div(search_.rows, most)).feasible) {
      return std::nullopt;
    }
    std::int64_t low = 1;  // does not fit
    std::int64_t high = most;  // fits
    while (high - low > 1) {
      const std::int64_t middle = (low + high) / 2;
      (at(ceil_div(search_.rows, middle)).feasible ? high : low) = middle;
    }
    return ceil_div(search_.rows, high);
  }

 private:
  double fraction_;
  const ShareSearch& search_;
  const EvaluateOption& evaluate_;
  std::map<std::int64_t, WeighedOption> solved_;
};

}  // namespace

std::vector<ShareChoice> weigh_shares(const std::vector<double>& fractions, const ShareSearch& search,
                                      const EvaluateOption& evaluate) {
  STOWAGE_CHECK(search.rows >= 1 && search.smallest >= 1, "weigh_shares: rows and smallest must be positive, not ",
                search.rows, " and ", search.smallest);
  STOWAGE_CHECK(!search.micro_rows || *search.micro_rows >= 1, "weigh_shares: micro_rows must be positive");
  std::vector<ShareChoice> listed;
  for (const double fraction : fractions) {
    ShareWeighing weighing(fraction, search, evaluate);
    if (search.micro_rows) {
      weighing.at(*search.micro_rows);
      listed.push_back({fraction, *search.micro_rows});
      continue;
    }
    const std::optional<std::int64_t> largest = weighing.largest_fitting();
    if (!largest || *largest < search.rows) {
      listed.push_back({fraction, search.rows});
    }
    if (!largest) {
      continue;
    }
    std::int64_t size = *largest;
    for (int cut = 0; cut <= search.extra_cuts; ++cut) {
      const WeighedOption& option = weighing.at(size);
      listed.push_back({fraction, size});
      if (option.keeps_everything || size / 2 < search.smallest) {
        break;
      }
      size = ceil_div(size, 2);
    }
  }
  return listed;
}

std::optional<ShareChoice> pick_choice(const TimedChoices& step_ms, double tie,
                                       const std::optional<ShareChoice>& as_given) {
  if (step_ms.empty()) {
    return std::nullopt;
  }
  if (as_given && std::any_of(step_ms.begin(), step_ms.end(), [&](const auto& timed) { return timed.first == *as_given; })) {
    return as_given;
  }
  double fastest = step_ms.front().second;
  for (const auto& [choice, ms] : step_ms) {
    fastest = std::min(fastest, ms);
  }
  std::optional<ShareChoice> best;
  for (const auto& [choice, ms] : step_ms) {
    const bool tied = ms <= fastest * (1 + tie);
    const auto rank = [](const ShareChoice& c) { return std::tuple(!c.parameters_on_host, c.micro_rows, c.fraction); };
    if (tied && (!best || rank(choice) > rank(*best))) {
      best = choice;
    }
  }
  return best;
}

std::optional<ShareChoice> agree_choice(const std::vector<TimedChoices>& per_rank, double tie) {
  if (per_rank.empty()) {
    return std::nullopt;
  }
  TimedChoices common;
  for (const auto& [choice, ms] : per_rank.front()) {
    double slowest = ms;
    bool everywhere = true;
    for (const TimedChoices& rank : per_rank) {
      const auto found = std::find_if(rank.begin(), rank.end(), [&](const auto& timed) { return timed.first == choice; });
      if (found == rank.end()) {
        everywhere = false;
        break;
      }
      slowest = std::max(slowest, found->second);
    }
    if (everywhere) {
      common.emplace_back(choice, slowest);
    }
  }
  return pick_choice(common, tie);
}

}  // namespace stowage::planner
