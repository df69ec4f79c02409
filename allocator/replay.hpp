// Replays a recorded allocation trace through a CachingAllocator on a simulated device.
//
// A trace is the alloc, free and mark_step events of one device of a PyTorch memory snapshot (or of a
// stowage recording), in order. The replay drives a CachingAllocator over a synchronous
// HostBackend of the given capacity, mapping the trace's addresses to its own blocks. Frees of
// addresses the trace never allocated (allocated before recording began) are skipped and
// counted; zero-size events are counted no-ops; an alloc at an address still live (its free
// was not recorded) frees the older block first and is counted. After an OOM the replay stops
// calling the allocator but keeps counting, so peak_requested always covers the whole trace.
//
// Steps: the trace's mark_step events end steps (a trace without them is one step). For each
// step the replay reports what the allocator asked of the device (pages mapped and unmapped,
// device calls) and what those calls would cost a GPU under the simulated device's cost model
// (host_call_costs.hpp), so that page moves once warm, and the milliseconds they add to a step,
// can be read off a replay.
//
// Contract: a Trace is immutable after construction and may be replayed concurrently; each
// replay builds its own device and allocator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "allocator/config.hpp"
#include "device/host/host_call_costs.hpp"

namespace stowage {

struct TraceEvent {
  // kMarkStep: the program called mark_step() (Note [Learned placement]).
  enum class Kind : std::uint8_t { kAlloc = 0, kFree = 1, kMarkStep = 2 };
  Kind kind = Kind::kAlloc;
  std::uint64_t address = 0;
  std::uint64_t size = 0;  // the caller's bytes (allocs); ignored for frees
  std::uint64_t stream = 0;
};

// What the allocator asked of the device over one step of a replay.
struct ReplayStep {
  std::size_t maps = 0;          // pages mapped
  std::size_t unmaps = 0;        // pages unmapped
  std::size_t device_calls = 0;  // memory-management calls (stats.hpp: num_device_calls)
  std::uint64_t charged_ns = 0;  // their cost on a GPU, by the cost model
  std::size_t reserved = 0;      // reserved bytes when the step ended
};

struct ReplayOptions {
  std::size_t capacity_bytes = std::size_t{1} << 40;
  AllocatorConfig config;
  bool measure_latency = true;  // time every allocator call (the p50 and p99 below)
  HostCallCosts costs = HostCallCosts::measured_h100();
};

struct ReplayResult {
  std::size_t events = 0;
  std::size_t allocs = 0;
  std::size_t frees = 0;
  std::size_t skipped_frees = 0;   // frees of addresses the trace never allocated
  std::size_t zero_size = 0;       // zero-byte allocs and frees of address 0
  std::size_t implicit_frees = 0;  // allocs at an address still live
  std::size_t peak_requested = 0;  // largest sum of live requested bytes in the trace
  std::size_t peak_allocated = 0;  // the allocator's peak of allocated (rounded) bytes
  std::size_t peak_reserved = 0;   // the allocator's peak of reserved bytes
  std::size_t peak_mapped_pages = 0;  // paged path: most pages mapped at once (live mappings)
  std::size_t maps = 0;            // paged path: pages mapped and unmapped over the replay
  std::size_t unmaps = 0;
  std::size_t layouts_made = 0;    // placement:learned: step layouts made, departures from
  std::size_t departures = 0;      // them, and requests served at the layout's offset
  std::size_t placed_allocations = 0;
  std::size_t arena_bytes = 0;     // the layout in force at the end, and its packing bound
  std::size_t layout_live_bytes = 0;
  bool oom = false;
  std::size_t oom_event = 0;       // index of the event that failed
  std::string oom_message;
  double ns_per_call_p50 = 0;      // host time of one allocator call (malloc or free)
  double ns_per_call_p99 = 0;
  double seconds = 0;              // wall time of the events (device setup and teardown excluded)
  std::vector<ReplayStep> steps;   // one per step, in order
};

class Trace {
 public:
  explicit Trace(std::vector<TraceEvent> events) : events_(std::move(events)) {}

  const std::vector<TraceEvent>& events() const noexcept { return events_; }

  ReplayResult replay(const ReplayOptions& options) const;

 private:
  std::vector<TraceEvent> events_;
};

}  // namespace stowage
