#include "planner/greedy_solver.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace stowage::planner {

namespace {

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

std::size_t prefetch_issue_op(const Simulator& simulator, const SavedTensor& s) {
  const std::size_t ahead = simulator.cost().prefetch_ops;
  return s.first_backward_use > ahead ? s.first_backward_use - ahead : 0;
}

// The estimated time of each choice for tensor `t` (the same estimates as the candidates').
double estimated_cost(const Simulator& simulator, const OpClock& clock, const SavedTensor& s, Decision d) {
  if (d == Decision::kRecompute) return s.recompute_ms;
  const std::size_t issue = prefetch_issue_op(simulator, s);
  const double window = clock.start(s.first_backward_use) - clock.start(issue);
  return std::max(0.0, static_cast<double>(s.bytes) / simulator.cost().to_device_bytes_per_ms - window);
}

// The kept tensors live at `op` that a decision would free there, each with its cheaper decision.
std::vector<Candidate> candidates_at(const Simulator& simulator, const OpClock& clock, const Plan& plan,
                                     std::size_t op) {
  const auto& tensors = simulator.trace().tensors;
  const CostModel& cost = simulator.cost();
  std::vector<Candidate> found;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const SavedTensor& s = tensors[t];
    if (plan[t] != Decision::kKeep || s.bytes == 0 || op <= s.last_forward_use || op >= s.first_backward_use) {
      continue;
    }
    const double bytes = static_cast<double>(s.bytes);
    double best = INFINITY;
    Decision decision = Decision::kKeep;
    if (s.recomputable) {
      best = s.recompute_ms;
      decision = Decision::kRecompute;
    }
    const std::size_t issue = prefetch_issue_op(simulator, s);
    const std::size_t out_op = clock.op_at(clock.end(s.created) + bytes / cost.to_host_bytes_per_ms);
    if (s.offloadable && op > std::max(out_op, s.last_forward_use) && op < issue) {
      // The exposed part of the page-in, and a little for the link's use so that a free offload
      // of a small tensor is preferred to one of a large tensor.
      const double exposed = estimated_cost(simulator, clock, s, Decision::kOffload) +
                             1e-6 * bytes / cost.to_device_bytes_per_ms;
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
Simulation reduce_peak(Simulator& simulator, Plan& plan, Simulation current, std::uint64_t budget) {
  const OpClock clock(simulator.trace());
  const std::size_t rounds = 4 * plan.size() + 8;
  for (std::size_t round = 0; round < rounds && current.peak_bytes > budget; ++round) {
    const std::vector<Candidate> found = candidates_at(simulator, clock, plan, current.peak_op);
    if (found.empty()) break;
    const std::uint64_t excess = current.peak_bytes - budget;
    std::uint64_t freed = 0;
    for (const Candidate& c : found) {
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

// Tries each decision that is not keep as keep (where the memory could allow it) and as the
// other choice (where the estimate says it is not dearer); keeps what simulates better.
Simulation refine(Simulator& simulator, Plan& plan, Simulation current, std::uint64_t budget) {
  const auto& tensors = simulator.trace().tensors;
  const OpClock clock(simulator.trace());
  const std::size_t passes = tensors.size() > 2000 ? 2 : 4;
  for (std::size_t pass = 0; pass < passes; ++pass) {
    bool improved = false;
    for (std::size_t t = 0; t < plan.size(); ++t) {
      if (plan[t] == Decision::kKeep) continue;
      const Decision original = plan[t];
      const Decision other = original == Decision::kOffload ? Decision::kRecompute : Decision::kOffload;
      const bool fits_now = current.peak_bytes <= budget;
      const std::array<bool, 2> worth = {
          !fits_now || keeping_could_fit(tensors[t], current, budget),
          (other == Decision::kRecompute ? tensors[t].recomputable : tensors[t].offloadable) &&
              (!fits_now || estimated_cost(simulator, clock, tensors[t], other) <=
                                estimated_cost(simulator, clock, tensors[t], original))};
      const std::array<Decision, 2> alternatives = {Decision::kKeep, other};
      for (std::size_t a = 0; a < alternatives.size(); ++a) {
        if (!worth[a]) continue;
        plan[t] = alternatives[a];
        Simulation trial = simulator.simulate(plan);
        if (better_outcome(trial, current, budget)) {
          current = std::move(trial);
          improved = true;
          break;
        }
        plan[t] = original;
      }
    }
    if (!improved) break;
  }
  return current;
}

}  // namespace

Solution solve_greedy(Simulator& simulator, std::uint64_t budget) {
  Solution solution;
  solution.plan.assign(simulator.trace().tensors.size(), Decision::kKeep);
  Simulation current = simulator.simulate(solution.plan);
  if (current.peak_bytes > budget) {
    current = reduce_peak(simulator, solution.plan, std::move(current), budget);
    current = refine(simulator, solution.plan, std::move(current), budget);
  }
  solution.fits = current.peak_bytes <= budget;
  solution.simulation = std::move(current);
  return solution;
}

}  // namespace stowage::planner
