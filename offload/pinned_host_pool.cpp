#include "offload/pinned_host_pool.hpp"

#include <algorithm>
#include <exception>
#include <utility>

#include "base/errors.hpp"
#include "base/log.hpp"

namespace stowage {

AllocatorConfig PinnedHostPool::pool_config() {
  AllocatorConfig config;
  config.virtual_memory = VirtualMemoryMode::kOff;  // host memory: whole segments
  config.reserve_headroom = 1;  // pinned segments are kept, never given back to make room
  return config;
}

PinnedHostPool::PinnedHostPool(DeviceBackend& backend, PinnedHostPoolOptions options)
    : segments_(backend, NumaHostMemory::near_device(options.pci_bus_id), options.limit_bytes),
      allocator_(backend, segments_, pool_config()),
      resident_(backend, segments_, pool_config()) {}

void* PinnedHostPool::allocate(std::size_t bytes, Stream stream) {
  return allocator_.malloc(bytes, stream);
}

void* PinnedHostPool::try_allocate(std::size_t bytes, Stream stream) {
  try {
    return allocator_.malloc(bytes, stream);
  } catch (const OutOfMemory&) {
    return nullptr;
  }
}

void* PinnedHostPool::allocate_resident(std::size_t bytes) {
  return resident_.malloc(bytes, Stream{});
}

void PinnedHostPool::free_resident(void* ptr) noexcept {
  resident_.free(ptr);
  try {  // no copy uses a resident block once it is freed: nothing to wait for
    resident_.empty_cache();
  } catch (const std::exception& error) {
    log_warning(
        detail::concat("the pinned host pool kept a freed resident segment: ", error.what()));
  }
}

bool PinnedHostPool::settle(Stream stream) {
  std::lock_guard lock(settle_mutex_);
  DeviceStats before = allocator_.stats();
  if (before.allocated_bytes.all().current != 0) return false;
  note_peaks(before);
  if (before.segment.of(SizeClass::kLarge).current <= 1) return false;
  const auto peak = static_cast<std::size_t>(before.allocated_bytes.of(SizeClass::kLarge).peak);
  allocator_.release_free_segments(SizeClass::kLarge);
  try {
    allocator_.free(allocator_.malloc(peak, stream));  // one segment, kept in the cache
  } catch (const OutOfMemory& error) {
    log_warning(detail::concat("the pinned host pool could not hold its peak in one segment: ",
                               error.what()));
  }
  note_peaks(allocator_.stats());
  allocator_.reset_peak_stats();
  ++num_settles_;
  return true;
}

void PinnedHostPool::note_peaks(const DeviceStats& stats) {
  peak_allocated_ = std::max(peak_allocated_, stats.allocated_bytes.all().peak);
}

PinnedHostPoolStats PinnedHostPool::stats() const {
  const DeviceStats steps = allocator_.stats();
  const DeviceStats resident = resident_.stats();
  std::lock_guard lock(settle_mutex_);
  PinnedHostPoolStats out;
  out.resident_allocated_bytes = resident.allocated_bytes.all().current;
  out.resident_reserved_bytes = resident.reserved_bytes.all().current;
  out.allocated_bytes = steps.allocated_bytes.all().current + out.resident_allocated_bytes;
  out.peak_allocated_bytes = std::max(peak_allocated_, steps.allocated_bytes.all().peak) +
                             resident.allocated_bytes.all().peak;
  out.reserved_bytes = steps.reserved_bytes.all().current + out.resident_reserved_bytes;
  out.segments = segments_.stats();
  out.peak_reserved_bytes = static_cast<std::int64_t>(out.segments.peak_bytes);
  out.num_segments = steps.segment.all().current + resident.segment.all().current;
  out.num_syncs = steps.num_sync_all_streams + resident.num_sync_all_streams;
  out.num_settles = num_settles_;
  return out;
}

}  // namespace stowage
