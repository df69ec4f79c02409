// Whether two recordings of a step at different sizes are one step (Note [Sized traces]): the
// same ops (name, phase, region, place in it), the same saved tensors (all but their bytes and
// times) and the same checkpoint regions.
//
// Contract: a pure function of two traces; the message names the first difference, where it lies
// (the op, the tensor and its producer, or the modules whose saves differ in number) and the two
// sizes, as `at_first` and `at_other` name them.
#pragma once

#include <optional>
#include <string>

#include "planner/lifetime_trace.hpp"

namespace stowage::planner {

std::optional<std::string> step_difference(const LifetimeTrace& first, const LifetimeTrace& other,
                                           const std::string& at_first, const std::string& at_other);

}  // namespace stowage::planner
