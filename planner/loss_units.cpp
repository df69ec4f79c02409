#include "planner/loss_units.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include "base/errors.hpp"

namespace stowage::planner {
namespace {

using Shares = std::vector<std::vector<double>>;  // per cut, per micro-batch

// As Python's format(value, ".7g") writes it.
std::string shown(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  std::ostringstream out;
  out << std::setprecision(7) << value;
  return out.str();
}

// The candidate's shares of every cut where every span's equation holds; else why not.
std::optional<Shares> holds(const std::vector<CutLosses>& cuts, const LossCandidate& candidate, double tolerance,
                            std::string& why_not) {
  STOWAGE_CHECK(candidate.counts.size() == cuts.size(), "judge_loss_units: ", candidate.name, " counts ",
                candidate.counts.size(), " cuts, not ", cuts.size());
  Shares shares;
  for (std::size_t cut = 0; cut < cuts.size(); ++cut) {
    const auto& counts = candidate.counts[cut];
    const auto& losses = cuts[cut].losses;
    STOWAGE_CHECK(counts.size() == losses.size(), "judge_loss_units: counts and losses of a cut differ in length");
    for (const LossSpan& span : cuts[cut].spans) {
      STOWAGE_CHECK(span.first < span.end && span.end <= counts.size(), "judge_loss_units: a span out of its cut");
      double total = 0.0, weighted = 0.0, scale = std::abs(span.loss);
      for (std::size_t i = span.first; i < span.end; ++i) {
        if (!(counts[i] > 0)) continue;
        total += counts[i];
        weighted += counts[i] * losses[i];
        scale = std::max(scale, std::abs(losses[i]));
      }
      if (!(total > 0)) {
        why_not = "the example batch holds no " + candidate.name;
        return std::nullopt;
      }
      const double predicted = weighted / total;
      if (!(std::isfinite(predicted) && std::abs(span.loss - predicted) <= tolerance * scale)) {
        const bool whole = span.end - span.first == counts.size();
        why_not = "the loss of " + std::string(whole ? "the whole batch" : "a span") + " (" + shown(span.loss) +
                  ") is not its micro-batches' weighted by " + candidate.name + " (" + shown(predicted) + ")";
        return std::nullopt;
      }
    }
    double total = 0.0;
    for (const double count : counts) total += count;
    auto& cut_shares = shares.emplace_back();
    for (const double count : counts) cut_shares.push_back(count / total);
  }
  return shares;
}

// What one rounding of each dtype is worth, relative: the floor a loss of it holds to, the ceiling
// the forwards' least precise dtype sets.
struct Rounding {
  double floor;
  double ceiling;
};

Rounding rounding_of(const std::string& dtype) {
  static const std::map<std::string, Rounding> known{{"float64", {1e-13, 1e-10}},
                                                     {"float32", {1e-6, 1e-5}},
                                                     {"float16", {2e-3, 2e-3}},
                                                     {"bfloat16", {1.6e-2, 1.6e-2}}};
  const auto found = known.find(dtype);
  return found == known.end() ? known.at("float32") : found->second;
}

std::optional<std::vector<double>> normalised(const UnitCounts& units, std::string& why_not) {
  double total = 0.0;
  for (const double count : units.counts) total += count;
  if (!(total > 0)) {
    why_not = "stowage.fit: the batch holds no " + units.name + " to average the loss over";
    return std::nullopt;
  }
  std::vector<double> shares;
  for (const double count : units.counts) shares.push_back(count / total);
  return shares;
}

std::string shares_shown(const std::vector<double>& shares) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(3);
  for (std::size_t i = 0; i < shares.size(); ++i) out << (i ? "/" : "") << shares[i];
  return out.str();
}

bool alike(const Shares& ours, const Shares& theirs) {
  for (std::size_t cut = 0; cut < std::min(ours.size(), theirs.size()); ++cut) {
    for (std::size_t i = 0; i < std::min(ours[cut].size(), theirs[cut].size()); ++i) {
      if (!(std::abs(ours[cut][i] - theirs[cut][i]) <= kSharesAlike)) return false;
    }
  }
  return true;
}

}  // namespace

UnitsJudgement judge_loss_units(const std::vector<CutLosses>& cuts, const std::vector<LossCandidate>& candidates,
                                double tolerance, const std::string& random_ops) {
  std::vector<std::vector<std::pair<std::size_t, Shares>>> groups;  // candidates giving alike shares
  std::string worst;
  for (std::size_t index = 0; index < candidates.size(); ++index) {
    std::string miss;
    auto shares = holds(cuts, candidates[index], tolerance, miss);
    if (!shares) {
      if (worst.empty()) worst = miss;
      continue;
    }
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return alike(g[0].second, *shares); });
    if (group != groups.end()) {
      group->emplace_back(index, std::move(*shares));
    } else {
      groups.push_back({{index, std::move(*shares)}});
    }
  }
  if (groups.size() == 1) {
    UnitsJudgement found;
    for (const auto& member : groups[0]) found.alike.push_back(member.first);
    return found;
  }
  if (!groups.empty()) {
    std::string names;
    for (std::size_t g = 0; g < std::min<std::size_t>(groups.size(), 3); ++g) {
      names += (g ? " or over " : "") + candidates[groups[g][0].first].name;
    }
    return {{}, "the example batch cannot tell whether the loss is a mean over " + names +
                    ": each weighs its micro-batches' losses to the whole's within rounding, though differently "
                    "(their losses are too alike); pass loss_units= to say which"};
  }
  std::string said = candidates.size() > 1 ? worst + ", nor by any other count its tensors offer" : worst;
  if (!random_ops.empty()) {
    said += "; the step draws random numbers (" + random_ops + ") that a cut draws differently";
  }
  return {{}, said + "; pass loss_units= to say what it is a mean over"};
}

double loss_tolerance(const std::vector<std::string>& dtypes, const std::string& loss_dtype, bool tf32,
                      std::optional<double> noise) {
  double ceiling = 0.0;
  for (const std::string& dtype : dtypes.empty() ? std::vector<std::string>{"float32"} : dtypes) {
    ceiling = std::max(ceiling, rounding_of(dtype).ceiling);
    if (dtype == "float32" && tf32) ceiling = std::max(ceiling, rounding_of("float16").ceiling);
  }
  if (!noise) return ceiling;
  return std::min(ceiling, std::max(rounding_of(loss_dtype).floor, kNoiseMargin * *noise));
}

UnitShares unit_shares(const UnitCounts& units, const std::vector<UnitCounts>& alike) {
  UnitShares found;
  auto shares = normalised(units, found.why_not);
  if (!shares) return found;
  for (const UnitCounts& other : alike) {
    auto theirs = normalised(other, found.why_not);
    if (!theirs) return found;
    for (std::size_t i = 0; i < std::min(shares->size(), theirs->size()); ++i) {
      if (std::abs((*shares)[i] - (*theirs)[i]) > kSharesAlike) {
        found.why_not = "stowage.fit: this batch's micro-batches weigh " + shares_shown(*shares) + " by " + units.name +
                        " and " + shares_shown(*theirs) + " by " + other.name +
                        ", and the example batch could not tell which of them the loss is a mean over (it weighed its "
                        "own micro-batches alike by both). Give fit an example batch like this one (its padding, its "
                        "masks), or say which: loss_units=...";
        return found;
      }
    }
  }
  found.shares = std::move(*shares);
  return found;
}

}  // namespace stowage::planner
