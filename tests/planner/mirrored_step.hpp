// A test step of `n` forward ops, each making one offloadable (not recomputable) tensor that the
// mirrored backward op uses again: only offload moves its peak. The ops' durations and memory and
// the tensors' bytes come from the callables, called in that order (ops forward, then backward,
// then tensors), so a seeded generator gives the same step every run.
#pragma once

#include <cstddef>
#include <cstdint>

#include "planner/lifetime_trace.hpp"

namespace stowage::planner {

template <typename OpMs, typename TensorBytes>
LifetimeTrace mirrored_step(std::size_t n, OpMs op_ms, std::uint64_t op_bytes, TensorBytes tensor_bytes) {
  LifetimeTrace trace;
  for (std::size_t i = 0; i < n; ++i) trace.ops.push_back({"f", "m", Phase::kForward, op_ms(), op_bytes});
  for (std::size_t i = 0; i < n; ++i) trace.ops.push_back({"b", "m", Phase::kBackward, op_ms(), op_bytes});
  for (std::size_t i = 0; i < n; ++i) {
    SavedTensor s;
    s.module = "m";
    s.bytes = tensor_bytes();
    s.created = i;
    s.last_forward_use = i;
    s.first_backward_use = 2 * n - 1 - i;
    s.last_backward_use = 2 * n - 1 - i;
    s.recomputable = false;
    trace.tensors.push_back(s);
  }
  return trace;
}

}  // namespace stowage::planner
