#include "planner/exhaustive_solver.hpp"

#include "base/errors.hpp"
#include "planner/greedy_solver.hpp"
#include "planner/region_use.hpp"

namespace stowage::planner {
namespace {

class Search {
 public:
  Search(Simulator& simulator, std::uint64_t budget)
      : simulator_(simulator), tensors_(simulator.trace().tensors), budget_(budget),
        compute_ms_(simulator.trace().compute_ms()), plan_(tensors_.size(), Decision::kKeep),
        regions_(simulator.trace(), plan_) {}

  Solution run() {
    best_ = solve_greedy(simulator_, budget_);  // a first bound to prune against
    visit(0, 0.0);
    best_.fits = best_.simulation.peak_bytes <= budget_;
    return best_;
  }

 private:
  void visit(std::size_t index, double recompute_ms) {
    // A plan that fits cannot beat a fitting best whose step is already no longer than this bound.
    const bool best_fits = best_.simulation.peak_bytes <= budget_;
    if (best_fits && compute_ms_ + recompute_ms > best_.simulation.step_ms + 1e-9) return;
    if (index == tensors_.size()) {
      Simulation trial = simulator_.simulate(plan_);
      if (better_outcome(trial, best_.simulation, budget_)) {
        best_.plan = plan_;
        best_.simulation = std::move(trial);
      }
      return;
    }
    const SavedTensor& s = tensors_[index];
    visit(index + 1, recompute_ms);  // kept
    if (s.offloadable) try_decision(index, Decision::kOffload, recompute_ms);
    if (s.recomputable) try_decision(index, Decision::kRecompute, recompute_ms + s.recompute_ms);
  }

  // Visits the plans where tensor `index` takes `d` (when its region allows it), then keeps it.
  void try_decision(std::size_t index, Decision d, double recompute_ms) {
    const SavedTensor& s = tensors_[index];
    if (!regions_.allows(s, d)) return;
    regions_.change(s, Decision::kKeep, d);
    plan_[index] = d;
    visit(index + 1, recompute_ms);
    plan_[index] = Decision::kKeep;
    regions_.change(s, d, Decision::kKeep);
  }

  Simulator& simulator_;
  const std::vector<SavedTensor>& tensors_;
  std::uint64_t budget_;
  double compute_ms_;
  Plan plan_;
  RegionUse regions_;
  Solution best_;
};

}  // namespace

Solution solve_exhaustive(Simulator& simulator, std::uint64_t budget) {
  STOWAGE_CHECK(simulator.trace().tensors.size() <= kMaxExhaustiveTensors, "the exhaustive planner takes at most ",
                kMaxExhaustiveTensors, " saved tensors, not ", simulator.trace().tensors.size());
  return Search(simulator, budget).run();
}

}  // namespace stowage::planner
