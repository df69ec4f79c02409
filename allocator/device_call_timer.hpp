// Counts one memory-management call to the device, and the host time it took, in an allocator's
// statistics (num_device_calls, device_call_ns: stats.hpp). Made just before the call; counts
// when it goes out of scope, whether the call returned or threw.
//
// Contract: scoped; the allocator's lock guards the statistics it writes.
#pragma once

#include <chrono>
#include <utility>

#include "allocator/stats.hpp"

namespace stowage {

class DeviceCallTimer {
 public:
  explicit DeviceCallTimer(DeviceStats& stats) noexcept
      : stats_(stats), start_(std::chrono::steady_clock::now()) {}
  ~DeviceCallTimer() {
    ++stats_.num_device_calls;
    stats_.device_call_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now() - start_)
                                 .count();
  }
  DeviceCallTimer(const DeviceCallTimer&) = delete;
  DeviceCallTimer& operator=(const DeviceCallTimer&) = delete;

 private:
  DeviceStats& stats_;
  std::chrono::steady_clock::time_point start_;
};

// Runs `call`, a device call, counted and timed in `stats`.
template <typename Call>
decltype(auto) timed_call(DeviceStats& stats, Call&& call) {
  const DeviceCallTimer timer(stats);
  return std::forward<Call>(call)();
}

}  // namespace stowage
