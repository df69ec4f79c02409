#include "planner/gradients_sent.hpp"

#include <algorithm>
#include <cstddef>
#include <optional>

namespace stowage::planner {

bool inside_unit(const std::string& module, const std::string& unit) {
  return module == unit || (module.size() > unit.size() && module.starts_with(unit) && module[unit.size()] == '.');
}

LifetimeTrace with_gradients_sent(LifetimeTrace trace, const UnitGradients& units) {
  std::vector<std::uint64_t> sent(trace.ops.size() + 1, 0);  // bytes leaving from each op on (a running sum)
  for (const auto& [unit, bytes] : units) {
    if (bytes <= 0) continue;
    std::optional<std::size_t> last;  // the unit's last backward use of what it saved
    for (const SavedTensor& tensor : trace.tensors) {
      if (inside_unit(tensor.module, unit)) last = std::max(last.value_or(0), tensor.last_backward_use);
    }
    if (last && *last < trace.ops.size()) sent[*last + 1] += static_cast<std::uint64_t>(bytes);
  }
  std::uint64_t gone = 0;
  for (std::size_t i = 0; i < trace.ops.size(); ++i) {
    gone += sent[i];
    TraceOp& op = trace.ops[i];
    op.other_bytes -= std::min(op.other_bytes, gone);
  }
  return trace;
}

}  // namespace stowage::planner
