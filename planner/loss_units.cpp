#include "planner/loss_units.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <optional>
#include <sstream>

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

}  // namespace stowage::planner
