#include "planner/parameter_prefetch.hpp"

#include <algorithm>
#include <limits>
#include <optional>

#include "base/errors.hpp"
#include "planner/gradients_sent.hpp"

namespace stowage::planner {

namespace {

std::optional<std::size_t> unit_of(const std::string& module, const std::vector<std::string>& unit_paths) {
  for (std::size_t u = 0; u < unit_paths.size(); ++u) {
    if (inside_unit(module, unit_paths[u])) return u;
  }
  return std::nullopt;
}

// The units in the order forward first runs them, the compute before each; a unit run again later
// (a block called twice) adds that compute, and the compute before it, to its own.
std::vector<PassUnit> forward_pass(const LifetimeTrace& trace, const std::vector<std::string>& unit_paths) {
  std::vector<PassUnit> pass;
  std::vector<std::optional<std::size_t>> entry(unit_paths.size());
  double before = 0;
  for (const TraceOp& op : trace.ops) {
    if (op.phase != Phase::kForward) continue;
    const std::optional<std::size_t> unit = unit_of(op.module, unit_paths);
    if (!unit) {
      before += op.duration_ms;
      continue;
    }
    if (!entry[*unit]) {
      entry[*unit] = pass.size();
      pass.push_back(PassUnit{*unit, before, 0});
      before = 0;
    }
    PassUnit& running = pass[*entry[*unit]];
    running.compute_ms += before + op.duration_ms;
    before = 0;
  }
  for (std::size_t u = 0; u < unit_paths.size(); ++u) {
    if (!entry[u]) pass.push_back(PassUnit{u, 0, 0});
  }
  return pass;
}

// The units in reverse forward order, each spanning its saved tensors' backward uses.
std::vector<PassUnit> backward_pass(const LifetimeTrace& trace, const std::vector<std::string>& unit_paths,
                                    const std::vector<PassUnit>& forward) {
  constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> first(unit_paths.size(), kNone);
  std::vector<std::size_t> last(unit_paths.size(), 0);
  for (const SavedTensor& tensor : trace.tensors) {
    const std::optional<std::size_t> unit = unit_of(tensor.module, unit_paths);
    if (!unit) continue;
    first[*unit] = std::min(first[*unit], tensor.first_backward_use);
    last[*unit] = std::max(last[*unit], tensor.last_backward_use);
  }
  const auto backward_ms = [&trace](std::size_t from, std::size_t to) {  // [from, to)
    double ms = 0;
    for (std::size_t i = from; i < std::min(to, trace.ops.size()); ++i) {
      if (trace.ops[i].phase == Phase::kBackward) ms += trace.ops[i].duration_ms;
    }
    return ms;
  };
  const auto begins = std::find_if(trace.ops.begin(), trace.ops.end(),
                                   [](const TraceOp& op) { return op.phase == Phase::kBackward; });
  std::size_t cursor = static_cast<std::size_t>(begins - trace.ops.begin());
  std::vector<PassUnit> pass;
  for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
    const std::size_t u = it->unit;
    if (first[u] == kNone) {
      pass.push_back(PassUnit{u, 0, 0});
      continue;
    }
    const std::size_t start = std::max(cursor, first[u]);
    const std::size_t end = std::max(last[u] + 1, start);
    pass.push_back(PassUnit{u, backward_ms(cursor, start), backward_ms(start, end)});
    cursor = end;
  }
  return pass;
}

}  // namespace

double UnitPasses::compute_ms() const {
  double ms = 0;
  for (const std::vector<PassUnit>* pass : {&forward, &backward}) {
    for (const PassUnit& unit : *pass) ms += unit.before_ms + unit.compute_ms;
  }
  return ms;
}

UnitPasses unit_passes(const LifetimeTrace& trace, const std::vector<std::string>& unit_paths) {
  UnitPasses passes;
  passes.forward = forward_pass(trace, unit_paths);
  passes.backward = backward_pass(trace, unit_paths, passes.forward);
  return passes;
}

double exposed_copy_ms(const std::vector<PassUnit>& pass, const std::vector<std::int64_t>& unit_bytes,
                       double bytes_per_ms, std::size_t depth) {
  STOWAGE_CHECK(bytes_per_ms > 0, "exposed_copy_ms: a copy rate of ", bytes_per_ms, " bytes/ms");
  for (const PassUnit& unit : pass) {
    STOWAGE_CHECK(unit.unit < unit_bytes.size(), "exposed_copy_ms: unit ", unit.unit, " of ", unit_bytes.size());
  }
  std::vector<double> ready(pass.size(), 0);  // when each position's copy is done
  std::size_t issued = 0;
  double copies_free = 0;  // when the copy stream has done what it was given
  double now = 0;          // the compute's clock
  double waited = 0;
  for (std::size_t i = 0; i < pass.size(); ++i) {
    now += pass[i].before_ms;
    // The unit starting asks for its own copy and those of the `depth` units after it.
    for (const std::size_t last = std::min(pass.size() - 1, i + depth); issued <= last; ++issued) {
      copies_free = std::max(now, copies_free) + static_cast<double>(unit_bytes[pass[issued].unit]) / bytes_per_ms;
      ready[issued] = copies_free;
    }
    const double begins = std::max(now, ready[i]);
    waited += begins - now;
    now = begins + pass[i].compute_ms;
  }
  return waited;
}

std::int64_t window_bytes(const std::vector<PassUnit>& order, const std::vector<std::int64_t>& unit_bytes,
                          std::size_t depth) {
  std::int64_t most = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    std::int64_t held = 0;
    for (std::size_t j = i; j < order.size() && j <= i + depth; ++j) held += unit_bytes.at(order[j].unit);
    most = std::max(most, held);
  }
  return most;
}

ParameterPrefetch choose_parameter_prefetch(const UnitPasses& passes, const std::vector<std::int64_t>& unit_bytes,
                                            double to_device_bytes_per_ms, std::int64_t room_bytes) {
  ParameterPrefetch found;
  const std::size_t depths = std::max<std::size_t>(passes.forward.size(), 1);
  for (std::size_t depth = 0; depth < depths; ++depth) {
    found.exposed_ms.push_back(exposed_copy_ms(passes.forward, unit_bytes, to_device_bytes_per_ms, depth) +
                               exposed_copy_ms(passes.backward, unit_bytes, to_device_bytes_per_ms, depth));
    found.window_bytes.push_back(window_bytes(passes.forward, unit_bytes, depth));
  }
  // The depths that fit are the shallowest ones: the window never shrinks deeper.
  std::size_t fitting = 0;
  while (fitting < depths && found.window_bytes[fitting] <= room_bytes) ++fitting;
  if (fitting == 0) return found;
  const double least = *std::min_element(found.exposed_ms.begin(), found.exposed_ms.begin() +
                                                                        static_cast<std::ptrdiff_t>(fitting));
  const double tie = kDepthTie * passes.compute_ms();
  while (found.exposed_ms[found.depth] > least + tie) ++found.depth;
  return found;
}

}  // namespace stowage::planner
