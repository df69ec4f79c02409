// What moving and remaking activations costs on this machine: the copy bandwidth each way (the
// host link, one copy at a time in each direction) and how far ahead of its use backward starts
// bringing a page back. Op durations are in the trace. Measured by a short calibration
// (python/stowage/plan), or given by the user.
#pragma once

#include <cstddef>

namespace stowage::planner {

struct CostModel {
  double to_host_bytes_per_ms = 0;    // device -> host
  double to_device_bytes_per_ms = 0;  // host -> device
  // A page-in starts when the compute reaches the op this many before the first that needs it.
  std::size_t prefetch_ops = 2;

  void validate() const;
};

}  // namespace stowage::planner
