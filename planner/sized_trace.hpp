// One step recorded at a grid of sizes (batch, sequence length, ...), and its lifetime trace at
// any sizes (Note [Sized traces]).
//
// Note [Sized traces]
// The traces at the grid's points have one structure (the same ops, saved tensors and regions;
// the caller checks that, naming the first difference); only their measured figures differ. At
// other sizes each byte count (a saved tensor's `bytes`, an op's `in_use_bytes` and `io_bytes`) is
// the Lagrange polynomial through the grid, one factor per size of degree one less than its points
// (two points give a line, three a parabola: unfused attention's scores grow with the square of
// the sequence), floored at the least the grid measured and rounded half to even. Byte counts
// follow from shapes, so they come out exact. Times are noisy: an op's time is its kind's line
// (planner/time_fit.hpp) at its interpolated `io_bytes`. What follows from those is derived again
// (planner/derived_quantities.hpp), the step's unconstrained peak among them.
//
// Contract: a value type, immutable once built; the constructor throws LogicError for a grid that
// is not one (fewer than two distinct points per size, a trace count other than the grid's) and
// at() for sizes that are not the grid's or that take a byte count beyond kMaxBytes (one tensor)
// or kMaxTotalBytes (any sum): sizes far beyond those recorded.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "planner/lifetime_trace.hpp"
#include "planner/time_fit.hpp"

namespace stowage::planner {

inline constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 50;       // 1 PiB: beyond any device
inline constexpr std::uint64_t kMaxTotalBytes = std::uint64_t{1} << 56;  // sums stay exact in 64 bits

struct GridSize {
  std::string name;
  std::vector<std::int64_t> points;
};

struct SizedPoint {
  LifetimeTrace trace;
  std::uint64_t unconstrained_peak_bytes = 0;
};

class SizedTrace {
 public:
  // `traces[i]` recorded at the i-th point of the grid, the last size varying fastest.
  SizedTrace(std::vector<GridSize> sizes, std::vector<LifetimeTrace> traces);

  // The trace at `values` (one per size, in the grid's order).
  SizedPoint at(const std::vector<std::int64_t>& values) const;

  const std::vector<GridSize>& sizes() const { return sizes_; }

 private:
  std::vector<double> weights(const std::vector<std::int64_t>& values) const;
  std::int64_t interpolate(const std::vector<double>& weights, const std::vector<std::int64_t>& values) const;
  void check_bounds(const LifetimeTrace& trace, const std::string& where) const;

  std::vector<GridSize> sizes_;
  std::vector<LifetimeTrace> traces_;
  std::map<std::string, TimeLine> op_times_;
};

}  // namespace stowage::planner
