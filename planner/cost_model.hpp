// What moving and remaking activations costs on this machine: the copy bandwidth each way (the host
// link, one copy at a time in each direction) and how many buffers backward keeps coming back ahead
// of use (the offloader's fixed prefetch: each buffer asked for brings back the buffers offloaded
// before it, until `prefetch_depth` are back or coming and unused). Op durations are in the trace.
// Measured by a short calibration (python/stowage/plan), or given by the user.
#pragma once

#include <cstddef>

namespace stowage::planner {

struct CostModel {
  double to_host_bytes_per_ms = 0;    // device -> host
  double to_device_bytes_per_ms = 0;  // host -> device
  std::size_t prefetch_depth = 2;

  void validate() const;
};

}  // namespace stowage::planner
