#include "allocator/replay.hpp"

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "allocator/caching_allocator.hpp"
#include "allocator/base/errors.hpp"
#include "allocator/device/host/host_backend.hpp"

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

struct LiveBlock {
  void* ptr = nullptr;     // nullptr once the allocator is no longer called (after an OOM)
  std::uint64_t size = 0;  // requested bytes
};

}  // namespace

ReplayResult Trace::replay(std::size_t capacity_bytes, const AllocatorConfig& config,
                           bool measure_latency) const {
  HostBackendOptions options;
  options.capacity_bytes = capacity_bytes;
  options.synchronous = true;
  options.back_mappings = false;  // a replay never touches the memory it allocates
  HostBackend backend(options);
  ReplayResult result;
  std::vector<std::uint32_t> latencies;
  if (measure_latency) latencies.reserve(events_.size());
  std::unordered_map<std::uint64_t, LiveBlock> live;
  live.reserve(events_.size() / 2 + 1);
  std::size_t requested = 0;
  {
    CachingAllocator allocator(backend, config);
    const auto start = Clock::now();
    auto timed = [&](auto&& call) {
      if (!measure_latency) return call();
      const auto before = Clock::now();
      auto value = call();
      const auto elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - before);
      latencies.push_back(static_cast<std::uint32_t>(std::min<std::int64_t>(elapsed.count(), UINT32_MAX)));
      return value;
    };
    auto release = [&](const LiveBlock& block) {
      requested -= block.size;
      if (block.ptr == nullptr) return;
      timed([&] {
        allocator.free(block.ptr);
        return 0;
      });
    };
    for (std::size_t i = 0; i < events_.size(); ++i) {
      const TraceEvent& event = events_[i];
      ++result.events;
      if (event.kind == TraceEvent::Kind::kMarkStep) {
        timed([&] {
          allocator.mark_step();
          return 0;
        });
        continue;
      }
      if (event.kind == TraceEvent::Kind::kFree) {
        ++result.frees;
        if (event.address == 0) {
          ++result.zero_size;
          continue;
        }
        const auto it = live.find(event.address);
        if (it == live.end()) {
          ++result.skipped_frees;
          continue;
        }
        release(it->second);
        live.erase(it);
        continue;
      }
      ++result.allocs;
      if (event.size == 0) {
        ++result.zero_size;
        continue;
      }
      if (const auto it = live.find(event.address); it != live.end()) {
        ++result.implicit_frees;
        release(it->second);
        live.erase(it);
      }
      LiveBlock block{nullptr, event.size};
      if (!result.oom) {
        try {
          block.ptr = timed([&] {
            return allocator.malloc(static_cast<std::size_t>(event.size), Stream{event.stream});
          });
        } catch (const OutOfMemory& error) {
          result.oom = true;
          result.oom_event = i;
          result.oom_message = error.message();
        }
      }
      requested += event.size;
      result.peak_requested = std::max(result.peak_requested, requested);
      live.emplace(event.address, block);
    }
    result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const DeviceStats stats = allocator.stats();
    result.peak_allocated = static_cast<std::size_t>(stats.allocated_bytes.all().peak);
    result.peak_reserved = static_cast<std::size_t>(stats.reserved_bytes.all().peak);
    result.peak_mapped_pages = static_cast<std::size_t>(stats.mapped_pages.peak);
    result.maps = static_cast<std::size_t>(stats.num_maps);
    result.unmaps = static_cast<std::size_t>(stats.num_unmaps);
    const CachingAllocator::PlacementStatus placement = allocator.placement_status();
    result.plans_made = placement.plans_made;
    result.departures = static_cast<std::size_t>(placement.departures);
    result.planned_allocations = placement.planned_allocations;
    result.arena_bytes = placement.arena_bytes;
    result.plan_live_bytes = placement.plan_live_bytes;
    for (const auto& [address, block] : live) {
      if (block.ptr != nullptr) allocator.free(block.ptr);
    }
  }
  result.ns_per_call_p50 = percentile(latencies, 0.50);
  result.ns_per_call_p99 = percentile(latencies, 0.99);
  return result;
}

}  // namespace stowage
