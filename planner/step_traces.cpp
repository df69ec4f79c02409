#include "planner/step_traces.hpp"

#include <cmath>
#include <utility>

#include "base/errors.hpp"

namespace stowage::planner {

StepTraces::StepTraces(LifetimeTrace trace, CostModel cost) : whole_(std::move(trace)), cost_(cost) {}

StepTraces::StepTraces(SizedTrace sized, std::vector<std::int64_t> values, std::size_t rows_size, CostModel cost)
    : sized_(std::move(sized)), values_(std::move(values)), rows_size_(rows_size), cost_(cost) {
  STOWAGE_CHECK(values_.size() == sized_->sizes().size(), "a sized trace of ", sized_->sizes().size(),
                " sizes is evaluated at as many values, not ", values_.size());
  STOWAGE_CHECK(rows_size_ < values_.size(), "the rows' size ", rows_size_, " is not one of the grid's ",
                values_.size());
}

StepTraces StepTraces::without_recompute(const std::set<std::int32_t>& regions) const {
  StepTraces out = *this;
  out.not_recomputed_.insert(regions.begin(), regions.end());
  return out;
}

StepTraces StepTraces::with_compute_scale(double scale) const {
  STOWAGE_CHECK(std::isfinite(scale) && scale > 0, "a step's compute scale must be positive and finite, not ", scale);
  StepTraces out = *this;
  out.compute_scale_ = scale;
  return out;
}

LifetimeTrace StepTraces::at(std::int64_t rows) const {
  LifetimeTrace trace;
  if (whole_) {
    trace = *whole_;
  } else {
    std::vector<std::int64_t> values = values_;
    values[rows_size_] = rows;
    trace = sized_->at(values).trace;
  }
  for (SavedTensor& tensor : trace.tensors) {
    if (not_recomputed_.contains(tensor.region)) tensor.recomputable = false;
    tensor.recompute_ms *= compute_scale_;
  }
  for (TraceOp& op : trace.ops) op.duration_ms *= compute_scale_;
  for (std::size_t r = 0; r < trace.regions.size(); ++r) {
    if (not_recomputed_.contains(static_cast<std::int32_t>(r))) trace.regions[r].checkpointable = false;
  }
  return trace;
}

}  // namespace stowage::planner
