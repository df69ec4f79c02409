// How many blocks' parameters come in ahead of the one running, where the blocks' parameters live on
// the host (stowage.offload.parameters; Note [Parameter prefetch depth]).
//
// Note [Parameter prefetch depth]
// The offloaded parameters' schedule (Note [Parameters off the device] in
// offload/parameter_schedule.hpp) fills a unit's copy when the unit starts, or, `depth` units
// ahead, when the unit `depth` before it in the pass's order starts (forward in forward, reversed
// in backward); the units' copies go in that order through one host-to-device stream, and a unit's
// compute waits for its own copy. Each pass is simulated so over the step's recorded compute: the
// units in the pass's order, each with the compute before it (since the last unit ended: the
// embedding, a residual add, the loss's backward) and its own (`unit_passes`). Its exposed time is
// the pass's time less its compute: what the compute waited for the copies. A unit's copy cannot
// start before the unit `depth` + 1 before it has ended (its memory is freed then), which the
// order above keeps: a unit starts after the one before it ends.
//
// Deeper, the copies are asked for earlier and none later, so the exposed time never grows with
// the depth; the window does: at depth d the schedule holds the running unit and d more, at most
// the largest d + 1 consecutive units' parameters (parameters shared by units count once there,
// so this bounds it). The depth chosen is the fewest units ahead whose exposed time is within
// kDepthTie of the passes' compute of the least exposed time among the depths whose window fits
// the room; 0 where even one unit's does not.
//
// A backward op carries no module path; the tensors a unit saved do: a unit's backward spans its
// saved tensors' first to last backward use (from where the unit before it in backward ended, when
// they overlap). A unit whose ops the trace does not show (none ran under its path) is taken as
// running no compute after the units seen, in forward and in backward: its copy covered by nothing.
//
// Contract: pure functions of their inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "planner/lifetime_trace.hpp"

namespace stowage::planner {

// The exposed time within this share of the passes' compute of the least counts as the least.
inline constexpr double kDepthTie = 0.01;

// One unit in one pass: which unit (its index among the units given), the compute since the unit
// before it in the pass ended (or the pass began), and its own.
struct PassUnit {
  std::size_t unit = 0;
  double before_ms = 0;
  double compute_ms = 0;
};

// Both passes as the parameters' copies see them: the units in the order each pass runs them.
struct UnitPasses {
  std::vector<PassUnit> forward;
  std::vector<PassUnit> backward;

  double compute_ms() const;  // the units' compute and the compute before each, both passes
};

// `trace`'s passes over the units named by their module paths ("blocks.3" holds "blocks.3.mlp").
UnitPasses unit_passes(const LifetimeTrace& trace, const std::vector<std::string>& unit_paths);

// What the copies cost at each depth, and the depth chosen (Note [Parameter prefetch depth]).
struct ParameterPrefetch {
  std::size_t depth = 0;
  std::vector<double> exposed_ms;          // by depth, 0 to the units less one: both passes' wait
  std::vector<std::int64_t> window_bytes;  // by depth: the most the copies hold at once (parameters alone)

  double chosen_exposed_ms() const { return exposed_ms.empty() ? 0.0 : exposed_ms[depth]; }
  std::int64_t chosen_window_bytes() const { return window_bytes.empty() ? 0 : window_bytes[depth]; }
};

// The time one pass waits for the copies of `unit_bytes[u]` bytes at `bytes_per_ms`, `depth` ahead.
double exposed_copy_ms(const std::vector<PassUnit>& pass, const std::vector<std::int64_t>& unit_bytes,
                       double bytes_per_ms, std::size_t depth);

// The most `depth` + 1 consecutive units of `order` hold.
std::int64_t window_bytes(const std::vector<PassUnit>& order, const std::vector<std::int64_t>& unit_bytes,
                          std::size_t depth);

// The depth chosen for `passes` whose window (parameters alone) is at most `room_bytes`.
ParameterPrefetch choose_parameter_prefetch(const UnitPasses& passes, const std::vector<std::int64_t>& unit_bytes,
                                            double to_device_bytes_per_ms, std::int64_t room_bytes);

}  // namespace stowage::planner
