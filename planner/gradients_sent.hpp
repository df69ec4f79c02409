// A step's lifetime trace as it runs with some units' gradients sent to the host as backward makes
// them (stowage.offload.parameters: Note [Weighing fit's options]).
//
// A recorded trace counts every gradient in `other_bytes` from when backward makes it to the end.
// With a unit's gradients going to the host as they are made, the device holds none of them once
// backward has passed the unit: once every tensor saved inside the unit has had its last backward
// use (its gradients are made by then), its gradient bytes are taken off `other_bytes` of every
// later op (never below 0). Before, they stay counted (the window of fit's weighing holds a unit's
// gradients on top, so this is conservative). Backward ops carry no module path; the saved tensors
// do: a tensor is inside a unit when its module path is the unit's or below it ("blocks.3" holds
// "blocks.3" and "blocks.3.mlp", not "blocks.30"). A unit with no saved tensor changes nothing.
//
// Contract: a pure function of its inputs.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "planner/lifetime_trace.hpp"

namespace stowage::planner {

// A unit (its module path) and the bytes of its trained parameters' gradients.
using UnitGradients = std::vector<std::pair<std::string, std::int64_t>>;

// Whether `module` is `unit` or below it ("blocks.3" holds "blocks.3" and "blocks.3.mlp", not "blocks.30").
bool inside_unit(const std::string& module, const std::string& unit);

// `trace` with each unit's gradients off the device once backward has passed it.
LifetimeTrace with_gradients_sent(LifetimeTrace trace, const UnitGradients& units);

}  // namespace stowage::planner
