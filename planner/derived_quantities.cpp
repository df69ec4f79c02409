#include "planner/derived_quantities.hpp"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "base/errors.hpp"
#include "planner/plan.hpp"
#include "planner/simulator.hpp"

namespace stowage::planner {

void derive_other_bytes(LifetimeTrace& trace) {
  const std::size_t count = trace.ops.size();
  std::vector<std::int64_t> delta(count + 1, 0);
  for (const SavedTensor& s : trace.tensors) {
    STOWAGE_CHECK(s.created <= s.last_backward_use && s.last_backward_use < count, "saved tensor (", s.module,
                  ") lives from op ", s.created, " to op ", s.last_backward_use, ", outside the trace's ", count,
                  " ops");
    delta[s.created] += static_cast<std::int64_t>(s.bytes);
    delta[s.last_backward_use + 1] -= static_cast<std::int64_t>(s.bytes);
  }
  std::int64_t live = 0;
  for (std::size_t i = 0; i < count; ++i) {
    live += delta[i];
    trace.ops[i].other_bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(0, trace.ops[i].in_use_bytes - live));
  }
}

void derive_recompute_times(LifetimeTrace& trace) {
  std::unordered_map<std::size_t, std::size_t> tensor_of_op;  // the last tensor each op made
  for (std::size_t t = 0; t < trace.tensors.size(); ++t) tensor_of_op[trace.tensors[t].created] = t;
  std::unordered_map<std::int32_t, double> since_last;  // per region: forward time since its last tensor
  for (std::size_t i = 0; i < trace.ops.size(); ++i) {
    const TraceOp& op = trace.ops[i];
    if (op.phase != Phase::kForward || op.region < 0) continue;
    double& since = since_last[op.region];
    since += op.duration_ms;
    const auto found = tensor_of_op.find(i);
    if (found == tensor_of_op.end()) continue;
    SavedTensor& tensor = trace.tensors[found->second];
    if (tensor.region == op.region) {
      tensor.recompute_ms = since;
      since = 0;
    }
  }
}

std::uint64_t unconstrained_peak_bytes(const LifetimeTrace& trace) {
  const CostModel no_copies{1.0, 1.0, 0};  // keep-all copies nothing: any valid link does
  Simulator simulator(trace, no_copies);
  return simulator.simulate(Plan(trace.tensors.size(), Decision::kKeep)).peak_bytes;
}

}  // namespace stowage::planner
