#include "planner/greedy_solver.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "planner/region_use.hpp"

namespace stowage::planner {

namespace {

// How reduce_peak weighs the two ways to free memory: each estimate is multiplied by its factor,
// so a start can lean to one way and take the other only where the first is not open (an
// infinite factor: never).
struct Lean {
  double recompute = 1;
  double offload = 1;
};

struct Candidate {
  std::size_t tensor;
  Decision decision;
  double cost_per_byte;
  std::uint64_t bytes;
};

// Unstalled op times, for the estimates: when each op starts and ends on an undisturbed step.
class OpClock {
 public:
  explicit OpClock(const LifetimeTrace& trace) : end_(trace.ops.size()) {
    double time = 0;
    for (std::size_t i = 0; i < trace.ops.size(); ++i) end_[i] = time += trace.ops[i].duration_ms;
  }
  double start(std::size_t op) const { return op == 0 ? 0 : end_[op - 1]; }
  double end(std::size_t op) const { return end_[op]; }
  // The first op ending at or after `time`.
  std::size_t op_at(double time) const {
    return static_cast<std::size_t>(std::lower_bound(end_.begin(), end_.end(), time) - end_.begin());
  }

 private:
  std::vector<double> end_;
};

// Where backward would start bringing `s` back if it were offloaded beside the tensors `plan`
// offloads: when the buffer `prefetch_depth` before it in order of need is used (at the start of
// backward for the first ones). `needs`: the first backward uses of the offloaded tensors, sorted,
// `s` among them when `listed`; those needed at the same op count as ahead of it (an optimistic
// estimate, which the simulation then checks; it also counts recompute chains).
std::size_t prefetch_issue_op(const Simulator& simulator, const std::vector<std::size_t>& needs,
                              const SavedTensor& s, bool listed) {
  std::size_t before = static_cast<std::size_t>(
      std::upper_bound(needs.begin(), needs.end(), s.first_backward_use) - needs.begin());
  if (listed && before > 0) --before;
  const std::size_t buffers = simulator.cost().prefetch_depth;
  if (buffers == 0) return s.first_backward_use;  // nothing ahead: each asked for at its own use
  return before < buffers ? simulator.first_backward_op() : needs[before - buffers];
}

std::vector<std::size_t> offloaded_needs(const LifetimeTrace& trace, const Plan& plan) {
  std::vector<std::size_t> needs;
  for (std::size_t t = 0; t < plan.size(); ++t) {
    if (plan[t] == Decision::kOffload) needs.push_back(trace.tensors[t].first_backward_use);
  }
  std::sort(needs.begin(), needs.end());
  return needs;
}

// The estimated time of each choice for tensor `s` (the same estimates as the candidates').
double estimated_cost(const Simulator& simulator, const OpClock& clock, const std::vector<std::size_t>& needs,
                      const SavedTensor& s, Decision d, bool listed) {
  if (d == Decision::kRecompute) return s.recompute_ms;
  const std::size_t issue = prefetch_issue_op(simulator, needs, s, listed);
  const double window = clock.start(s.first_backward_use) - clock.start(issue);
  return std::max(0.0, static_cast<double>(s.bytes) / simulator.cost().to_device_bytes_per_ms - window);
}

// The kept tensors live at `op` that a decision would free there, each with its cheaper decision.
std::vector<Candidate> candidates_at(const Simulator& simulator, const OpClock& clock, const Plan& plan,
                                     const RegionUse& regions, Lean lean, std::size_t op) {
  const auto& tensors = simulator.trace().tensors;
  const CostModel& cost = simulator.cost();
  // Offloaded together, the candidates come back one after another: each is estimated as if the
  // kept tensors that could be offloaded here were too (the simulation then says what moved).
  std::vector<std::size_t> needs = offloaded_needs(simulator.trace(), plan);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const SavedTensor& s = tensors[t];
    if (plan[t] == Decision::kKeep && s.offloadable && op > s.last_forward_use && op < s.first_backward_use) {
      needs.push_back(s.first_backward_use);
    }
  }
  std::sort(needs.begin(), needs.end());
  std::vector<Candidate> found;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const SavedTensor& s = tensors[t];
    if (plan[t] != Decision::kKeep || s.bytes == 0 || op <= s.last_forward_use || op >= s.first_backward_use) {
      continue;
    }
    const double bytes = static_cast<double>(s.bytes);
    double best = INFINITY;
    Decision decision = Decision::kKeep;
    if (s.recomputable && std::isfinite(lean.recompute) && regions.allows(s, Decision::kRecompute) &&
        op < simulator.remade_before(s)) {
      best = s.recompute_ms * lean.recompute;
      decision = Decision::kRecompute;
    }
    const std::size_t issue = prefetch_issue_op(simulator, needs, s, s.offloadable);
    const std::size_t out_op = clock.op_at(clock.end(s.created) + bytes / cost.to_host_bytes_per_ms);
    if (s.offloadable && std::isfinite(lean.offload) && regions.allows(s, Decision::kOffload) && op > std::max(out_op, s.last_forward_use) &&
        op < issue) {
      // The exposed part of the reload, and a little for the link's use so that a free offload
      // of a small tensor is preferred to one of a large tensor.
      const double exposed = (estimated_cost(simulator, clock, needs, s, Decision::kOffload, true) +
                              1e-6 * bytes / cost.to_device_bytes_per_ms) * lean.offload;
      if (exposed < best) {
        best = exposed;
        decision = Decision::kOffload;
      }
    }
    if (decision != Decision::kKeep) found.push_back({t, decision, best / bytes, s.bytes});
  }
  std::sort(found.begin(), found.end(), [](const Candidate& a, const Candidate& b) {
    return a.cost_per_byte != b.cost_per_byte ? a.cost_per_byte < b.cost_per_byte : a.bytes > b.bytes;
  });
  return found;
}

// Brings the peak under `budget` (or as low as the candidates allow).
// With nothing to free at `op` by itself, offloads the kept tensor live there that backward needs
// soonest: it takes one of the buffers brought back first, so the reloads of tensors needed later
// start later, after `op`. False when there is none.
bool offload_sooner_needed(const Simulator& simulator, Plan& plan, RegionUse& regions, Lean lean, std::size_t op) {
  if (!std::isfinite(lean.offload)) return false;
  const auto& tensors = simulator.trace().tensors;
  std::size_t chosen = tensors.size();
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const SavedTensor& s = tensors[t];
    if (plan[t] != Decision::kKeep || !s.offloadable || !regions.allows(s, Decision::kOffload) ||
        op <= s.last_forward_use || op >= s.first_backward_use) {
      continue;
    }
    if (chosen == tensors.size() || s.first_backward_use < tensors[chosen].first_backward_use) chosen = t;
  }
  if (chosen == tensors.size()) return false;
  regions.change(tensors[chosen], Decision::kKeep, Decision::kOffload);
  plan[chosen] = Decision::kOffload;
  return true;
}

Simulation reduce_peak(Simulator& simulator, Plan& plan, Simulation current, std::uint64_t budget, Lean lean) {
  const OpClock clock(simulator.trace());
  const std::size_t rounds = 4 * plan.size() + 8;
  const auto& tensors = simulator.trace().tensors;
  RegionUse regions(simulator.trace(), plan);
  std::size_t fruitless = 0;
  for (std::size_t round = 0; round < rounds && current.peak_bytes > budget; ++round) {
    const std::vector<Candidate> found = candidates_at(simulator, clock, plan, regions, lean, current.peak_op);
    if (found.empty()) {
      // Buffers taken this way pay off once they fill the buffers brought back first; past that
      // many without the peak falling, nothing will.
      if (fruitless > simulator.cost().prefetch_depth) break;
      if (!offload_sooner_needed(simulator, plan, regions, lean, current.peak_op)) break;
      const std::uint64_t before = current.peak_bytes;
      current = simulator.simulate(plan);
      fruitless = current.peak_bytes < before ? 0 : fruitless + 1;
      continue;
    }
    fruitless = 0;
    const std::uint64_t excess = current.peak_bytes - budget;
    std::uint64_t freed = 0;
    for (const Candidate& c : found) {
      if (!regions.allows(tensors[c.tensor], c.decision)) continue;  // an earlier pick this round
      regions.change(tensors[c.tensor], plan[c.tensor], c.decision);
      plan[c.tensor] = c.decision;
      freed += c.bytes;
      if (freed >= excess) break;
    }
    current = simulator.simulate(plan);
  }
  return current;
}

// Whether keeping tensor `t` again could fit: it adds its bytes over the ops it was absent from.
bool keeping_could_fit(const SavedTensor& s, const Simulation& current, std::uint64_t budget) {
  for (std::size_t op = s.last_forward_use + 1; op < s.first_backward_use; ++op) {
    if (current.bytes_at_op[op] + s.bytes > budget) return false;
  }
  return true;
}

// A region's decisions move only together between recompute and offload (one tensor alone may
// not mix them): tries each region's recomputed tensors as offloaded, or its offloaded ones as
// recomputed (those that cannot be, kept), and keeps each change that simulates better.
bool switch_regions(Simulator& simulator, Plan& plan, Simulation& current, std::uint64_t budget) {
  const auto& tensors = simulator.trace().tensors;
  const std::size_t regions = simulator.trace().region_count();
  if (regions == 0) return false;
  std::vector<std::vector<std::size_t>> members(regions);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].region != kNoRegion) members[static_cast<std::size_t>(tensors[t].region)].push_back(t);
  }
  bool improved = false;
  Plan trial_plan;
  for (const auto& region : members) {
    trial_plan = plan;
    bool changed = false;
    for (const std::size_t t : region) {
      const SavedTensor& s = tensors[t];
      if (plan[t] == Decision::kRecompute) {
        trial_plan[t] = s.offloadable ? Decision::kOffload : Decision::kKeep;
        changed = true;
      } else if (plan[t] == Decision::kOffload) {
        trial_plan[t] = s.recomputable ? Decision::kRecompute : Decision::kKeep;
        changed = true;
      }
    }
    if (!changed) continue;
    Simulation trial = simulator.simulate(trial_plan);
    if (better_outcome(trial, current, budget)) {
      plan.swap(trial_plan);
      current = std::move(trial);
      improved = true;
    }
  }
  return improved;
}

// Tries each decision that is not keep as keep (where the memory could allow it) and as the
// other choice (where the estimate says it is not dearer); keeps what simulates better.
Simulation refine(Simulator& simulator, Plan& plan, Simulation current, std::uint64_t budget) {
  const auto& tensors = simulator.trace().tensors;
  const OpClock clock(simulator.trace());
  const std::size_t passes = tensors.size() > 2000 ? 2 : 4;
  for (std::size_t pass = 0; pass < passes; ++pass) {
    RegionUse regions(simulator.trace(), plan);  // switch_regions changes the plan between passes
    bool improved = false;
    const std::vector<std::size_t> needs = offloaded_needs(simulator.trace(), plan);  // as the pass began
    for (std::size_t t = 0; t < plan.size(); ++t) {
      if (plan[t] == Decision::kKeep) continue;
      const Decision original = plan[t];
      const Decision other = original == Decision::kOffload ? Decision::kRecompute : Decision::kOffload;
      const bool fits_now = current.peak_bytes <= budget;
      const std::array<bool, 2> worth = {
          !fits_now || keeping_could_fit(tensors[t], current, budget),
          (other == Decision::kRecompute ? tensors[t].recomputable : tensors[t].offloadable) &&
              regions.allows(tensors[t], other) &&
              (!fits_now || estimated_cost(simulator, clock, needs, tensors[t], other, original == Decision::kOffload) <=
                                estimated_cost(simulator, clock, needs, tensors[t], original, original == Decision::kOffload))};
      const std::array<Decision, 2> alternatives = {Decision::kKeep, other};
      for (std::size_t a = 0; a < alternatives.size(); ++a) {
        if (!worth[a]) continue;
        plan[t] = alternatives[a];
        regions.change(tensors[t], original, alternatives[a]);
        Simulation trial = simulator.simulate(plan);
        if (better_outcome(trial, current, budget)) {
          current = std::move(trial);
          improved = true;
          break;
        }
        regions.change(tensors[t], alternatives[a], original);
        plan[t] = original;
      }
    }
    improved = switch_regions(simulator, plan, current, budget) || improved;
    if (!improved) break;
  }
  return current;
}

constexpr std::size_t kRefineEachStartUpTo = 2000;  // saved tensors

}  // namespace

Solution solve_greedy(Simulator& simulator, std::uint64_t budget) {
  Solution best;
  best.plan.assign(simulator.trace().tensors.size(), Decision::kKeep);
  best.simulation = simulator.simulate(best.plan);
  if (best.simulation.peak_bytes > budget) {
    // Starts: the cheaper way per byte; leaning to recomputation, to offload (taking the other
    // way only where the first is not open); recomputation only, offload only (a region cannot
    // mix them, so an early pick of one can shut the other out). Each is refined (on large traces
    // only the best: refining costs a simulation per decision), and the best wins.
    constexpr double kLean = 1e6;
    const Simulation kept = best.simulation;
    bool first = true;
    const bool refine_each = best.plan.size() <= kRefineEachStartUpTo;
    for (const Lean lean : {Lean{}, Lean{1, kLean}, Lean{kLean, 1}, Lean{1, INFINITY}, Lean{INFINITY, 1}}) {
      Plan plan(best.plan.size(), Decision::kKeep);
      Simulation current = reduce_peak(simulator, plan, kept, budget, lean);
      if (refine_each) current = refine(simulator, plan, std::move(current), budget);
      if (first || better_outcome(current, best.simulation, budget)) {
        best.plan = std::move(plan);
        best.simulation = std::move(current);
        first = false;
      }
    }
    if (!refine_each) best.simulation = refine(simulator, best.plan, std::move(best.simulation), budget);
  }
  best.fits = best.simulation.peak_bytes <= budget;
  return best;
}

}  // namespace stowage::planner
