#include "planner/sized_trace.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "base/errors.hpp"
#include "planner/derived_quantities.hpp"

namespace stowage::planner {
namespace {

// Lagrange weights of `points` at `at`: a value's polynomial there is the weighted sum of its
// values at the points.
std::vector<double> lagrange(const std::vector<std::int64_t>& points, double at) {
  std::vector<double> weights;
  weights.reserve(points.size());
  for (std::size_t i = 0; i < points.size(); ++i) {
    double weight = 1.0;
    for (std::size_t j = 0; j < points.size(); ++j) {
      if (j != i) weight *= (at - static_cast<double>(points[j])) / static_cast<double>(points[i] - points[j]);
    }
    weights.push_back(weight);
  }
  return weights;
}

}  // namespace

SizedTrace::SizedTrace(std::vector<GridSize> sizes, std::vector<LifetimeTrace> traces)
    : sizes_(std::move(sizes)), traces_(std::move(traces)) {
  STOWAGE_CHECK(!sizes_.empty(), "a sized trace needs at least one size");
  std::size_t count = 1;
  for (const GridSize& size : sizes_) {
    const std::set<std::int64_t> distinct(size.points.begin(), size.points.end());
    STOWAGE_CHECK(size.points.size() >= 2 && distinct.size() == size.points.size() && *distinct.begin() > 0,
                  "size '", size.name, "': give two or more distinct positive points");
    count *= size.points.size();
  }
  STOWAGE_CHECK(count == traces_.size(), "a grid of ", count, " points needs as many traces, not ", traces_.size());
  for (const LifetimeTrace& trace : traces_) {
    STOWAGE_CHECK(trace.ops.size() == traces_[0].ops.size() && trace.tensors.size() == traces_[0].tensors.size(),
                  "the grid's traces differ in their ops or saved tensors");
  }
  std::vector<const LifetimeTrace*> all;
  for (const LifetimeTrace& trace : traces_) all.push_back(&trace);
  op_times_ = fit_op_times(all);
}

std::vector<double> SizedTrace::weights(const std::vector<std::int64_t>& values) const {
  STOWAGE_CHECK(values.size() == sizes_.size(), "the trace was recorded at ", sizes_.size(), " sizes; got ",
                values.size());
  std::vector<double> weights{1.0};
  for (std::size_t s = 0; s < sizes_.size(); ++s) {  // the last size varies fastest, as the grid's points
    const std::vector<double> along = lagrange(sizes_[s].points, static_cast<double>(values[s]));
    std::vector<double> next;
    next.reserve(weights.size() * along.size());
    for (const double w : weights) {
      for (const double a : along) next.push_back(w * a);
    }
    weights = std::move(next);
  }
  return weights;
}

std::int64_t SizedTrace::interpolate(const std::vector<double>& weights,
                                     const std::vector<std::int64_t>& values) const {
  double total = 0;
  for (std::size_t i = 0; i < values.size(); ++i) total += weights[i] * static_cast<double>(values[i]);
  STOWAGE_CHECK(std::isfinite(total) && total <= static_cast<double>(kMaxTotalBytes),
                "a byte count interpolates beyond any device's: sizes far beyond those recorded");
  const std::int64_t least = *std::min_element(values.begin(), values.end());
  if (total <= static_cast<double>(least)) return least;
  return static_cast<std::int64_t>(std::nearbyint(total));  // half to even, as the file's figures round
}

SizedPoint SizedTrace::at(const std::vector<std::int64_t>& values) const {
  const std::vector<double> w = weights(values);
  std::string where = "at ";
  for (std::size_t s = 0; s < sizes_.size(); ++s) {
    where += (s ? ", " : "") + sizes_[s].name + "=" + std::to_string(values[s]);
  }
  SizedPoint point{traces_[0], 0};
  LifetimeTrace& trace = point.trace;
  std::vector<std::int64_t> at_grid(traces_.size());
  for (std::size_t i = 0; i < trace.ops.size(); ++i) {
    TraceOp& op = trace.ops[i];
    for (std::size_t g = 0; g < traces_.size(); ++g) at_grid[g] = static_cast<std::int64_t>(traces_[g].ops[i].io_bytes);
    op.io_bytes = static_cast<std::uint64_t>(interpolate(w, at_grid));
    for (std::size_t g = 0; g < traces_.size(); ++g) at_grid[g] = traces_[g].ops[i].in_use_bytes;
    op.in_use_bytes = interpolate(w, at_grid);
    op.duration_ms = op_times_.at(op.name).at(static_cast<double>(op.io_bytes));
  }
  for (std::size_t t = 0; t < trace.tensors.size(); ++t) {
    for (std::size_t g = 0; g < traces_.size(); ++g) at_grid[g] = static_cast<std::int64_t>(traces_[g].tensors[t].bytes);
    trace.tensors[t].bytes = static_cast<std::uint64_t>(interpolate(w, at_grid));
  }
  check_bounds(trace, where);
  derive_other_bytes(trace);
  derive_recompute_times(trace);
  point.unconstrained_peak_bytes = planner::unconstrained_peak_bytes(trace);
  trace.unconstrained_peak_bytes = point.unconstrained_peak_bytes;
  return point;
}

void SizedTrace::check_bounds(const LifetimeTrace& trace, const std::string& where) const {
  std::uint64_t total = 0;
  for (std::size_t t = 0; t < trace.tensors.size(); ++t) {
    const SavedTensor& s = trace.tensors[t];
    STOWAGE_CHECK(s.bytes <= kMaxBytes, where, ", saved tensor ", t, " (", s.module, ") would hold ", s.bytes,
                  " bytes, above ", kMaxBytes, ": sizes far beyond those recorded");
    total = std::min(total + s.bytes, kMaxTotalBytes + 1);  // saturates: 5M tensors of 1 PiB pass 2**64
  }
  bool within = total <= kMaxTotalBytes;
  for (const TraceOp& op : trace.ops) {
    const auto in_use = static_cast<std::uint64_t>(op.in_use_bytes < 0 ? -op.in_use_bytes : op.in_use_bytes);
    within = within && in_use <= kMaxTotalBytes && op.io_bytes <= kMaxTotalBytes;
  }
  STOWAGE_CHECK(within, where, ", the step would use more than ", kMaxTotalBytes,
                " bytes: sizes far beyond those recorded");
}

}  // namespace stowage::planner
