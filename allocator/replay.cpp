#include "allocator/replay.hpp"

#include <algorithm>
#include <chrono>
#include <type_traits>
#include <unordered_map>

#include "allocator/caching_allocator.hpp"
#include "base/errors.hpp"
#include "device/host/host_backend.hpp"

namespace stowage {

namespace {

using Clock = std::chrono::steady_clock;

double percentile(std::vector<std::uint32_t>& samples, double fraction) {
  if (samples.empty()) return 0;
  const auto index = static_cast<std::size_t>(fraction * static_cast<double>(samples.size() - 1));
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(index),
                   samples.end());
  return samples[index];
}

HostBackendOptions replay_device(const ReplayOptions& replay) {
  HostBackendOptions options;
  options.capacity_bytes = replay.capacity_bytes;
  options.synchronous = true;
  options.back_mappings = false;  // a replay never touches the memory it allocates
  options.call_costs = replay.costs;
  return options;
}

// One replay: the trace's events applied to an allocator, with the figures kept as they go.
class Replayer {
 public:
  Replayer(HostBackend& backend, CachingAllocator& allocator, bool measure_latency,
           std::size_t events)
      : backend_(backend), allocator_(allocator), measure_latency_(measure_latency) {
    if (measure_latency_) latencies_.reserve(events);
    live_.reserve(events / 2 + 1);
  }

  void apply(const TraceEvent& event, std::size_t index) {
    ++result_.events;
    switch (event.kind) {
      case TraceEvent::Kind::kMarkStep:
        timed([&] {
          allocator_.mark_step();
          return 0;
        });
        end_step();
        return;
      case TraceEvent::Kind::kFree:
        free(event);
        return;
      case TraceEvent::Kind::kAlloc:
        alloc(event, index);
        return;
    }
  }

  // The allocator's figures, and frees for every block still live.
  ReplayResult finish(double seconds) {
    if (events_in_step_ > 0 || result_.steps.empty()) end_step();
    result_.seconds = seconds;
    const DeviceStats stats = allocator_.stats();
    result_.peak_allocated = static_cast<std::size_t>(stats.allocated_bytes.all().peak);
    result_.peak_reserved = static_cast<std::size_t>(stats.reserved_bytes.all().peak);
    result_.peak_mapped_pages = static_cast<std::size_t>(stats.mapped_pages.peak);
    result_.maps = static_cast<std::size_t>(stats.num_maps);
    result_.unmaps = static_cast<std::size_t>(stats.num_unmaps);
    const CachingAllocator::PlacementStatus placement = allocator_.placement_status();
    result_.layouts_made = placement.layouts_made;
    result_.departures = static_cast<std::size_t>(placement.departures);
    result_.placed_allocations = placement.placed_allocations;
    result_.arena_bytes = placement.arena_bytes;
    result_.layout_live_bytes = placement.layout_live_bytes;
    for (const auto& [address, block] : live_) {
      if (block.ptr != nullptr) allocator_.free(block.ptr);
    }
    result_.ns_per_call_p50 = percentile(latencies_, 0.50);
    result_.ns_per_call_p99 = percentile(latencies_, 0.99);
    return result_;
  }

 private:
  struct LiveBlock {
    void* ptr = nullptr;     // nullptr once the allocator is no longer called (after an OOM)
    std::uint64_t size = 0;  // requested bytes
  };

  template <typename Call>
  std::invoke_result_t<Call> timed(Call&& call) {
    if (!measure_latency_) return call();
    const auto before = Clock::now();
    auto value = call();
    const auto elapsed =
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - before).count();
    latencies_.push_back(static_cast<std::uint32_t>(std::min<std::int64_t>(elapsed, UINT32_MAX)));
    return value;
  }

  void release(const LiveBlock& block) {
    requested_ -= block.size;
    if (block.ptr == nullptr) return;
    timed([&] {
      allocator_.free(block.ptr);
      return 0;
    });
  }

  // What the device was asked since the last step ended.
  void end_step() {
    const DeviceStats stats = allocator_.stats();
    const StepCalls now = stats.calls_so_far();
    const std::uint64_t charged = backend_.charged_ns();
    result_.steps.push_back({static_cast<std::size_t>(now.maps - step_start_.maps),
                             static_cast<std::size_t>(now.unmaps - step_start_.unmaps),
                             static_cast<std::size_t>(now.device_calls - step_start_.device_calls),
                             charged - charged_start_,
                             static_cast<std::size_t>(stats.reserved_bytes.all().current)});
    step_start_ = now;
    charged_start_ = charged;
    events_in_step_ = 0;
  }

  void free(const TraceEvent& event) {
    ++events_in_step_;
    ++result_.frees;
    if (event.address == 0) {
      ++result_.zero_size;
      return;
    }
    const auto it = live_.find(event.address);
    if (it == live_.end()) {
      ++result_.skipped_frees;
      return;
    }
    release(it->second);
    live_.erase(it);
  }

  void alloc(const TraceEvent& event, std::size_t index) {
    ++events_in_step_;
    ++result_.allocs;
    if (event.size == 0) {
      ++result_.zero_size;
      return;
    }
    if (const auto it = live_.find(event.address); it != live_.end()) {
      ++result_.implicit_frees;
      release(it->second);
      live_.erase(it);
    }
    LiveBlock block{nullptr, event.size};
    if (!result_.oom) {
      try {
        block.ptr = timed([&] {
          return allocator_.malloc(static_cast<std::size_t>(event.size), Stream{event.stream});
        });
      } catch (const OutOfMemory& error) {
        result_.oom = true;
        result_.oom_event = index;
        result_.oom_message = error.message();
      }
    }
    requested_ += event.size;
    result_.peak_requested = std::max(result_.peak_requested, requested_);
    live_.emplace(event.address, block);
  }

  HostBackend& backend_;
  CachingAllocator& allocator_;
  const bool measure_latency_;
  StepCalls step_start_;
  std::uint64_t charged_start_ = 0;
  std::size_t events_in_step_ = 0;
  ReplayResult result_;
  std::vector<std::uint32_t> latencies_;
  std::unordered_map<std::uint64_t, LiveBlock> live_;
  std::size_t requested_ = 0;
};

}  // namespace

ReplayResult Trace::replay(const ReplayOptions& options) const {
  HostBackend backend(replay_device(options));
  CachingAllocator allocator(backend, options.config);
  Replayer replayer(backend, allocator, options.measure_latency, events_.size());
  const auto start = Clock::now();
  for (std::size_t i = 0; i < events_.size(); ++i) replayer.apply(events_[i], i);
  return replayer.finish(std::chrono::duration<double>(Clock::now() - start).count());
}

}  // namespace stowage
