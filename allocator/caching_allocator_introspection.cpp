// CachingAllocator: what callers can ask about its memory (statistics, history, snapshots, the
// block behind a pointer, the OOM report) and the stacks that tag its events.
#include <algorithm>
#include <exception>

#include "allocator/caching_allocator.hpp"

namespace stowage {

DeviceStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard lock(mutex_);
  stats_.reset_peak();
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard lock(mutex_);
  stats_.reset_accumulated();
  step_start_ = {};  // the step's counts start again from the reset counters
}

void CachingAllocator::record_history(bool enabled, std::size_t max_entries) {
  std::lock_guard lock(mutex_);
  if (enabled) {
    trace_.history().enable(max_entries);
  } else {
    trace_.history().disable();
  }
  history_on_.store(enabled, std::memory_order_relaxed);
}

void CachingAllocator::set_context_provider(ContextProvider provider) {
  std::lock_guard lock(mutex_);
  if (!provider) {
    context_provider_.store(nullptr);
    return;
  }
  providers_.push_back(std::make_unique<const ContextProvider>(std::move(provider)));
  context_provider_.store(providers_.back().get());
}

std::uint64_t CachingAllocator::history_recorded() const {
  std::lock_guard lock(mutex_);
  return trace_.history().recorded();
}

std::uint64_t CachingAllocator::context_for_history() const noexcept {
  if (!history_on_.load(std::memory_order_relaxed)) return 0;
  const ContextProvider* provider = context_provider_.load();
  if (provider == nullptr) return 0;
  try {
    return (*provider)();
  } catch (...) {
    return 0;
  }
}

void CachingAllocator::add_trace_listener(TraceListener listener) {
  std::lock_guard lock(mutex_);
  trace_.add_listener(std::move(listener));
}

AllocatorSnapshot CachingAllocator::snapshot() const {
  std::lock_guard lock(mutex_);
  AllocatorSnapshot out;
  out.device = backend_.properties().device_index;
  out.segments.reserve(cache_.segments().size());
  for (const auto& [base, segment] : cache_.segments()) append_snapshot(segment, out);
  out.trace = trace_.history().entries();
  out.trace_recorded = trace_.history().recorded();
  return out;
}

std::size_t CachingAllocator::block_size(const void* ptr) const {
  std::lock_guard lock(mutex_);
  const Block* block = cache_.find_allocated(reinterpret_cast<std::uintptr_t>(ptr));
  return block == nullptr ? 0 : block->size;
}

std::pair<void*, std::size_t> CachingAllocator::base_allocation(const void* ptr) const {
  std::lock_guard lock(mutex_);
  const Block* block = cache_.find_allocated(reinterpret_cast<std::uintptr_t>(ptr));
  if (block == nullptr) return {nullptr, 0};
  return mapped_range(*block);
}

std::size_t CachingAllocator::largest_available_block() const {
  std::lock_guard lock(mutex_);
  std::size_t largest = 0;
  shared_.cached(SizeClass::kLarge).for_each([&](const Block& block) {
    largest = std::max(largest, block.size);
  });
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
  std::size_t device_free = 0;
  try {
    device_free = segment_memory_.free_bytes();
  } catch (const std::exception&) {
    device_free = 0;
  }
  const std::size_t servable = std::max(largest, std::min(device_free, limit_.room(reserved)));
  const std::size_t ceiling = allocated_ceiling_.load(std::memory_order_relaxed);
  if (ceiling == kNoCeiling) return servable;
  const auto allocated = static_cast<std::size_t>(stats_.allocated_bytes.all().current);
  return std::min(servable, ceiling > allocated ? ceiling - allocated : 0);
}

OomReport CachingAllocator::oom_report_locked(std::size_t bytes, std::size_t rounded,
                                              Stream stream) {
  OomReport report;
  report.device = backend_.properties().device_index;
  report.requested = bytes;
  report.rounded = rounded;
  report.stream = stream;
  report.allocated = static_cast<std::size_t>(stats_.allocated_bytes.all().current);
  report.reserved = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
  report.reserved_unallocated = report.reserved - report.allocated;
  const SizeClass wanted = SizePolicy::size_class_for(rounded);
  for (const SizeClass size_class : {SizeClass::kSmall, SizeClass::kLarge}) {
    shared_.cached(size_class).for_each([&](const Block& block) {
      report.largest_free_block = std::max(report.largest_free_block, block.size);
      if (size_class == wanted && block.stream == stream) {
        report.largest_usable_block = std::max(report.largest_usable_block, block.size);
      }
    });
  }
  const MemoryNames names = segment_memory_.names();
  report.kind = names.kind;
  report.holder = names.holder;
  report.device_total = segment_memory_.total_bytes();
  try {
    report.device_free = segment_memory_.free_bytes();
  } catch (const std::exception&) {
    report.device_free = 0;
  }
  report.limit = limit_.bytes();
  report.cap = limit_.bound_name();
  report.describe();
  return report;
}

}  // namespace stowage
