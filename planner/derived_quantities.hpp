// What follows from a trace's measured figures rather than being measured itself (Note [Lifetime
// trace]): each op's memory besides the saved tensors live during it, each checkpointed tensor's
// recompute time, and the step's unconstrained peak. Derived once when a trace is built from a
// recorded step, and again when a trace is evaluated at other sizes (planner/sized_trace.hpp),
// where the measured figures changed.
//
// Contract: free functions over a trace the caller owns; they write only the derived fields.
#pragma once

#include <cstdint>

#include "planner/lifetime_trace.hpp"

namespace stowage::planner {

// Each op's `other_bytes`: its `in_use_bytes` less the saved tensors live during it (each from its
// `created` op to its `last_backward_use`), none when they account for all of it.
void derive_other_bytes(LifetimeTrace& trace);

// Each tensor of a region (`region` >= 0) made by a forward op of that region: the time to rerun its
// op and the region's forward ops since the region's previous such tensor (what recomputing it
// costs beyond the tensors before it). Tensors of no region keep their `recompute_ms`.
void derive_recompute_times(LifetimeTrace& trace);

// The step's peak with nothing changed: the simulated peak of the plan that keeps every saved
// tensor (no copies, no recomputation, so no cost model enters). The one meaning of the
// unconstrained peak everywhere: for a recorded step it is the measured peak wherever the saved
// tensors are counted in the memory in use, as a recording counts them.
std::uint64_t unconstrained_peak_bytes(const LifetimeTrace& trace);

}  // namespace stowage::planner
