#include "planner/simulator.hpp"

#include <algorithm>

#include "base/errors.hpp"
#include "planner/region_use.hpp"

namespace stowage::planner {

Simulator::Simulator(const LifetimeTrace& trace, const CostModel& cost, std::uint64_t ceiling)
    : trace_(trace), cost_(cost), ceiling_(ceiling) {
  trace_.validate();
  cost_.validate();
  const auto& ops = trace_.ops;
  first_backward_ = ops.size();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].phase != Phase::kForward) {
      first_backward_ = i;
      break;
    }
  }
  unstalled_end_.resize(ops.size());
  duration_ms_.resize(ops.size());
  other_bytes_.resize(ops.size());
  double time = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    duration_ms_[i] = ops[i].duration_ms;
    other_bytes_[i] = ops[i].other_bytes;
    time += ops[i].duration_ms;
    unstalled_end_[i] = time;
  }
  const std::size_t count = trace_.tensors.size();
  need_at_.resize(count);
  region_first_need_.assign(trace_.region_count(), ops.size());
  for (const SavedTensor& s : trace_.tensors) {
    if (s.region == kNoRegion) continue;
    auto& first = region_first_need_[static_cast<std::size_t>(s.region)];
    first = std::min(first, s.first_backward_use);
  }
  out_done_.resize(count);
  in_done_.resize(count);
}

std::size_t Simulator::remade_before(const SavedTensor& s) const {
  if (s.region == kNoRegion) return s.first_backward_use;
  return std::min(s.first_backward_use, region_first_need_[static_cast<std::size_t>(s.region)]);
}

void Simulator::check(const Plan& plan) const {
  const auto& tensors = trace_.tensors;
  STOWAGE_CHECK(plan.size() == tensors.size(), "a plan needs one decision per saved tensor: ", plan.size(),
                " for ", tensors.size());
  const RegionUse use(trace_, plan);
  for (std::size_t r = 0; r < use.regions(); ++r) {
    STOWAGE_CHECK(!use.mixes(r), "region ", r, " both recomputes and offloads saved tensors");
  }
  for (std::size_t t = 0; t < plan.size(); ++t) {
    STOWAGE_CHECK(plan[t] != Decision::kRecompute || tensors[t].recomputable, "saved tensor ", t, " (",
                  tensors[t].module, ") cannot be recomputed");
    STOWAGE_CHECK(plan[t] != Decision::kOffload || tensors[t].offloadable, "saved tensor ", t, " (",
                  tensors[t].module, ") cannot be offloaded");
  }
}

// need_at_: the first backward op that needs each tensor, earlier when a recomputed tensor made
// from it is made before its own first use (inputs precede their consumers, so one pass from the
// last tensor down carries each chain to its start).
void Simulator::schedule_recompute(const Plan& plan) {
  const auto& tensors = trace_.tensors;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    need_at_[t] = plan[t] == Decision::kRecompute ? remade_before(tensors[t]) : tensors[t].first_backward_use;
  }
  for (std::size_t t = tensors.size(); t-- > 0;) {
    if (plan[t] != Decision::kRecompute) continue;
    for (const std::size_t input : tensors[t].recompute_inputs) {
      need_at_[input] = std::min(need_at_[input], need_at_[t]);
    }
  }
}

void Simulator::schedule_offloads(const Plan& plan) {
  const auto& tensors = trace_.tensors;
  double link_free = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t) {  // recorded order: the order they are made
    if (plan[t] != Decision::kOffload) continue;
    const double start = std::max(link_free, unstalled_end_[tensors[t].created]);
    out_done_[t] = start + static_cast<double>(tensors[t].bytes) / cost_.to_host_bytes_per_ms;
    link_free = out_done_[t];
  }
  // The offloader brings buffers back in the reverse of their offload order (made order here).
  return_order_.clear();
  for (std::size_t t = tensors.size(); t-- > 0;) {
    if (plan[t] == Decision::kOffload) return_order_.push_back(t);
  }
}

void Simulator::add_live(std::size_t first, std::size_t last, std::uint64_t bytes) {
  live_delta_[first] += static_cast<std::int64_t>(bytes);
  live_delta_[last + 1] -= static_cast<std::int64_t>(bytes);
  if (first <= live_op_ && live_op_ <= last) live_at_op_ += static_cast<std::int64_t>(bytes);
}

void Simulator::advance_live_to(std::size_t op) {
  std::size_t next = live_op_ == SIZE_MAX ? 0 : live_op_ + 1;
  for (; next <= op; ++next) live_at_op_ += live_delta_[next];
  live_op_ = op;
}

// Whether `tensor` coming back ahead at `op` keeps the memory there within the ceiling.
bool Simulator::fits_ahead(std::size_t tensor, std::size_t op) const {
  if (ceiling_ == kNoCeiling) return true;
  const std::uint64_t at_op = other_bytes_[op] + static_cast<std::uint64_t>(std::max<std::int64_t>(live_at_op_, 0));
  return at_op + trace_.tensors[tensor].bytes <= ceiling_;
}

// The first op in [from, until) whose end (as run so far) is at or after `time`; `until` if none.
std::size_t Simulator::op_ending_after(double time, std::size_t from, std::size_t until) const {
  const auto begin = op_end_.begin() + static_cast<std::ptrdiff_t>(from);
  const auto end = op_end_.begin() + static_cast<std::ptrdiff_t>(until);
  return static_cast<std::size_t>(std::lower_bound(begin, end, time) - op_end_.begin());
}

// Issues `tensor`'s reload as the compute reaches `op` at `time`; records its live ranges.
void Simulator::issue_reload(std::size_t tensor, std::size_t op, double time, double& link_free) {
  const SavedTensor& s = trace_.tensors[tensor];
  if (out_done_[tensor] > time) {  // not out yet when asked back: resident throughout, no copy
    in_done_[tensor] = 0;
    add_live(s.created, s.last_backward_use, s.bytes);
    return;
  }
  const double start = std::max(link_free, time);
  in_done_[tensor] = start + static_cast<double>(s.bytes) / cost_.to_device_bytes_per_ms;
  link_free = in_done_[tensor];
  const std::size_t freed = std::max(s.last_forward_use, op_ending_after(out_done_[tensor], s.created, op));
  if (freed >= op) {
    add_live(s.created, s.last_backward_use, s.bytes);
  } else {
    add_live(s.created, freed, s.bytes);
    add_live(op, s.last_backward_use, s.bytes);
  }
}

// Backward (and the optimizer after it) op by op, as the offloader runs it (forward's last buffers
// asked for as backward starts, the last one often still on the device): each buffer an op needs is
// asked for (its copy starts then unless it came back ahead), and each ask brings back ahead the
// buffers offloaded before it that are still out, until `prefetch_depth` are back or coming and not
// yet used; the op waits for its buffers' copies, and for recomputation.
void Simulator::run_backward(Simulation& result) {
  const auto& ops = trace_.ops;
  double time = first_backward_ == 0 ? 0 : op_end_[first_backward_ - 1];
  double link_free = time;
  std::vector<std::vector<std::size_t>> needed_by(ops.size());
  for (std::size_t k = 0; k < return_order_.size(); ++k) needed_by[need_at_[return_order_[k]]].push_back(k);
  std::vector<bool> issued(return_order_.size(), false);
  std::size_t ahead = 0;  // issued buffers not needed yet
  live_op_ = SIZE_MAX;
  live_at_op_ = 0;
  if (first_backward_ < ops.size()) advance_live_to(first_backward_);
  for (std::size_t k = 0; k < return_order_.size() && ahead < cost_.prefetch_depth; ++k, ++ahead) {
    if (!fits_ahead(return_order_[k], first_backward_)) break;
    issue_reload(return_order_[k], first_backward_, time, link_free);  // forward's last buffers
    issued[k] = true;
  }
  for (std::size_t i = first_backward_; i < ops.size(); ++i) {
    advance_live_to(i);
    double start = time;
    for (const std::size_t k : needed_by[i]) {
      if (issued[k]) {
        --ahead;
      } else {
        issue_reload(return_order_[k], i, time, link_free);
        issued[k] = true;
      }
      start = std::max(start, in_done_[return_order_[k]]);
      for (std::size_t e = k + 1; e < return_order_.size() && ahead < cost_.prefetch_depth; ++e) {
        if (issued[e]) continue;
        if (!fits_ahead(return_order_[e], i)) break;
        issue_reload(return_order_[e], i, time, link_free);
        issued[e] = true;
        ++ahead;
      }
    }
    result.stall_ms += start - time;
    start += recompute_before_[i];
    result.recompute_ms += recompute_before_[i];
    time = start + duration_ms_[i];
    op_end_[i] = time;
  }
  result.step_ms = ops.empty() ? 0 : std::max(time, op_end_.back());
  live_op_ = SIZE_MAX;
}

Simulation Simulator::simulate(const Plan& plan) {
  check(plan);
  const auto& ops = trace_.ops;
  const auto& tensors = trace_.tensors;
  live_delta_.assign(ops.size() + 1, 0);
  recompute_before_.assign(ops.size(), 0.0);
  op_end_ = unstalled_end_;
  schedule_recompute(plan);
  schedule_offloads(plan);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const SavedTensor& s = tensors[t];
    if (plan[t] == Decision::kKeep) {
      add_live(s.created, s.last_backward_use, s.bytes);
    } else if (plan[t] == Decision::kRecompute) {
      add_live(s.created, s.last_forward_use, s.bytes);
      add_live(need_at_[t], s.last_backward_use, s.bytes);
      recompute_before_[need_at_[t]] += s.recompute_ms;
    }
  }
  Simulation result;
  run_backward(result);
  result.bytes_at_op.resize(ops.size());
  std::int64_t live = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    live += live_delta_[i];
    result.bytes_at_op[i] = other_bytes_[i] + static_cast<std::uint64_t>(live);
    if (result.bytes_at_op[i] > result.peak_bytes) {
      result.peak_bytes = result.bytes_at_op[i];
      result.peak_op = i;
    }
  }
  return result;
}

}  // namespace stowage::planner
