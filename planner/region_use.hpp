// How a plan uses each checkpoint region of a trace: how many of its tensors it recomputes and
// how many it offloads (a region may do one or the other, never both: Note [Lifetime trace]).
//
// Contract: a value; counts follow the plan it was made from and the changes told to it.
#pragma once

#include <cstddef>
#include <vector>

#include "planner/lifetime_trace.hpp"
#include "planner/plan.hpp"

namespace stowage::planner {

class RegionUse {
 public:
  RegionUse(const LifetimeTrace& trace, const Plan& plan);

  std::size_t regions() const noexcept { return recomputed_.size(); }
  bool mixes(std::size_t region) const { return recomputed_[region] > 0 && offloaded_[region] > 0; }
  // Whether tensor `s` may take decision `d` beside the other decisions of its region.
  bool allows(const SavedTensor& s, Decision d) const;
  // Tensor `s` changes from decision `from` to `to`.
  void change(const SavedTensor& s, Decision from, Decision to);

 private:
  std::vector<std::size_t> recomputed_;
  std::vector<std::size_t> offloaded_;
};

}  // namespace stowage::planner
