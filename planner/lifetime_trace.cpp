#include "planner/lifetime_trace.hpp"

#include <algorithm>

#include "base/errors.hpp"

namespace stowage::planner {

void LifetimeTrace::validate() const {
  const std::size_t count = ops.size();
  for (std::size_t i = 0; i < count; ++i) {
    STOWAGE_CHECK(ops[i].duration_ms >= 0, "op ", i, " (", ops[i].name, ") has a negative duration ",
                  ops[i].duration_ms);
  }
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const SavedTensor& s = tensors[t];
    STOWAGE_CHECK(s.created <= s.last_forward_use && s.last_forward_use < s.first_backward_use &&
                      s.first_backward_use <= s.last_backward_use && s.last_backward_use < count,
                  "saved tensor ", t, " (", s.module, ") must be created <= last forward use < first backward use "
                  "<= last backward use < ", count, " ops, not ", s.created, ", ", s.last_forward_use, ", ",
                  s.first_backward_use, ", ", s.last_backward_use);
    STOWAGE_CHECK(ops[s.first_backward_use].phase != Phase::kForward, "saved tensor ", t, " (", s.module,
                  ") is first used by backward at op ", s.first_backward_use, ", a forward op");
    STOWAGE_CHECK(s.region >= kNoRegion, "saved tensor ", t, " has region ", s.region, ", below ", kNoRegion);
    STOWAGE_CHECK(s.recompute_ms >= 0, "saved tensor ", t, " has a negative recompute time ", s.recompute_ms);
    for (const std::size_t input : s.recompute_inputs) {
      STOWAGE_CHECK(input < t, "saved tensor ", t, " (", s.module, ") is recomputed from tensor ", input,
                    ", which is not recorded before it");
      STOWAGE_CHECK(tensors[input].created <= s.created, "saved tensor ", t, " is recomputed from tensor ", input,
                    ", created after it");
    }
  }
}

std::size_t LifetimeTrace::region_count() const {
  std::int32_t highest = kNoRegion;
  for (const SavedTensor& s : tensors) highest = std::max(highest, s.region);
  return static_cast<std::size_t>(highest + 1);
}

double LifetimeTrace::compute_ms() const {
  double total = 0;
  for (const TraceOp& op : ops) total += op.duration_ms;
  return total;
}

}  // namespace stowage::planner
