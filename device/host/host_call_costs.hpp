// The simulated device's cost model: what each kind of device call would cost the host on a GPU.
//
// HostBackend charges every call it counts (fault_injector.hpp's BackendCall kinds) the cost
// given here, summing it in charged_ns() instead of spending it, so that a replay can say how
// many milliseconds the allocator's device calls would add to a training step on a GPU, without
// one. Zero by default (tests); measured_h100() holds figures measured on an H100, with the
// assumptions stated where a call was not measured on its own.
//
// Contract: plain values.
#pragma once

#include <array>
#include <cstdint>

#include "device/fault_injector.hpp"

namespace stowage {

struct HostCallCosts {
  std::array<std::uint64_t, kBackendCallKinds> ns{};  // by BackendCall

  std::uint64_t of(BackendCall call) const noexcept { return ns[static_cast<std::size_t>(call)]; }
  HostCallCosts& set(BackendCall call, std::uint64_t cost) noexcept {
    ns[static_cast<std::size_t>(call)] = cost;
    return *this;
  }
  bool any() const noexcept {
    for (const std::uint64_t cost : ns) {
      if (cost != 0) return true;
    }
    return false;
  }

  // Costs measured with CudaBackend on an H100 (bench/results/2026-11-23-h100/
  // bench_backend_ops.txt: `bench_backend_ops`, median of 5). Its virtual-memory cycle (create,
  // map, set access, unmap, release one 2 MiB page) took 63.6 us and its segment cycle
  // (cudaMalloc + cudaFree, 2 MiB) 89.1 us; each is split evenly over its calls, as the calls
  // were not timed one by one; a reservation, rare, is charged as a page call. A
  // synchronisation is charged 1 ms: what it waits for is the GPU
  // work queued on the stream, which a training step keeps at milliseconds; this one is an
  // assumption, not a measurement (bench/results/2026-11-24-cpu-steady-state.md).
  static HostCallCosts measured_h100() noexcept {
    HostCallCosts costs;
    constexpr std::uint64_t kPageCall = 63'600 / 5;
    constexpr std::uint64_t kSegmentCall = 89'100 / 2;
    for (const BackendCall call : {BackendCall::kCreatePhysical, BackendCall::kMap,
                                   BackendCall::kSetAccess, BackendCall::kUnmap,
                                   BackendCall::kReleasePhysical, BackendCall::kReserve,
                                   BackendCall::kReleaseReservation}) {
      costs.set(call, kPageCall);
    }
    costs.set(BackendCall::kAllocateSegment, kSegmentCall);
    costs.set(BackendCall::kFreeSegment, kSegmentCall);
    costs.set(BackendCall::kSynchronize, 1'000'000);
    return costs;
  }
};

}  // namespace stowage
