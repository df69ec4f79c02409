#include "planner/exhaustive_solver.hpp"

#include "allocator/base/errors.hpp"
#include "planner/greedy_solver.hpp"

namespace stowage::planner {
namespace {

class Search {
 public:
  Search(Simulator& simulator, std::uint64_t budget)
      : simulator_(simulator), tensors_(simulator.trace().tensors), budget_(budget),
        compute_ms_(simulator.trace().compute_ms()) {}

  Solution run() {
    best_ = solve_greedy(simulator_, budget_);  // a first bound to prune against
    plan_.assign(tensors_.size(), Decision::kKeep);
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
    plan_[index] = Decision::kKeep;
    visit(index + 1, recompute_ms);
    if (s.offloadable) {
      plan_[index] = Decision::kOffload;
      visit(index + 1, recompute_ms);
    }
    if (s.recomputable) {
      plan_[index] = Decision::kRecompute;
      visit(index + 1, recompute_ms + s.recompute_ms);
    }
    plan_[index] = Decision::kKeep;
  }

  Simulator& simulator_;
  const std::vector<SavedTensor>& tensors_;
  std::uint64_t budget_;
  double compute_ms_;
  Plan plan_;
  Solution best_;
};

}  // namespace

Solution solve_exhaustive(Simulator& simulator, std::uint64_t budget) {
  STOWAGE_CHECK(simulator.trace().tensors.size() <= kMaxExhaustiveTensors, "the exhaustive planner takes at most ",
                kMaxExhaustiveTensors, " saved tensors, not ", simulator.trace().tensors.size());
  return Search(simulator, budget).run();
}

}  // namespace stowage::planner
