#include "offload/pinned_segments.hpp"

#include <unistd.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "base/log.hpp"
#include "base/numbers.hpp"

namespace stowage {

namespace {

std::size_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return std::size_t{1} << 40;
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
}

}  // namespace

PinnedSegments::PinnedSegments(DeviceBackend& backend, NumaHostMemory memory,
                               std::size_t limit_bytes)
    : backend_(backend),
      memory_(std::move(memory)),
      limit_bytes_(limit_bytes != 0 ? limit_bytes : physical_memory_bytes()) {}

PinnedSegments::~PinnedSegments() {
  for (const auto& [base, held] : held_) release(base, held);
}

SegmentSizes PinnedSegments::sizes_for(std::size_t rounded) const {
  if (rounded <= SizePolicy::kSmallRequestMax) {
    return {SizePolicy::kSmallSegmentSize, SizePolicy::kSmallSegmentSize};
  }
  const std::size_t size = round_up(rounded, NumaHostMemory::page_size());
  return {size, size};
}

std::size_t PinnedSegments::free_bytes() {
  const std::size_t held = pinned_bytes_.load() + pageable_bytes_.load();
  return held < limit_bytes_ ? limit_bytes_ - held : 0;
}

void* PinnedSegments::try_allocate(std::size_t bytes) {
  const std::lock_guard lock(mutex_);
  if (bytes > free_bytes()) return nullptr;
  void* base = memory_.try_allocate(bytes);
  if (base == nullptr) return nullptr;
  bool pinned = false;
  if (!pinning_refused_.load()) {
    try {
      pinned = backend_.try_register_host(base, bytes);
    } catch (const std::exception& error) {
      memory_.free(base, bytes);
      throw;
    }
    if (!pinned) {
      pinning_refused_ = true;
      log_warning(detail::concat(
          "the host refused to pin ", format_bytes(bytes), " more (", format_bytes(pinned_bytes_),
          " pinned so far): offloaded tensors now go to pageable memory, where copies are "
          "slower and overlap compute less. Raise the locked-memory limit (ulimit -l) or "
          "free host memory to pin them."));
    }
  }
  held_.emplace(base, Held{bytes, pinned});
  if (pinned) {
    pinned_bytes_ += bytes;
    ++num_pinnings_;
  } else {
    pageable_bytes_ += bytes;
  }
  peak_bytes_ = std::max(peak_bytes_.load(), pinned_bytes_.load() + pageable_bytes_.load());
  return base;
}

void PinnedSegments::free(void* base) {
  const std::lock_guard lock(mutex_);
  const auto it = held_.find(base);
  STOWAGE_CHECK(it != held_.end(), "pinned host memory at ", base, " is not a segment of the pool");
  const Held held = it->second;
  held_.erase(it);
  release(base, held);
}

void PinnedSegments::release(void* base, const Held& held) noexcept {
  if (held.pinned) {
    try {
      backend_.unregister_host(base);
    } catch (const std::exception& error) {
      log_warning(detail::concat("unpinning host memory at ", base, " failed: ", error.what(),
                                 "; its pages stay locked"));
      pinned_bytes_ -= held.bytes;
      return;  // memory the device may still consider pinned must not go back to the host
    }
    pinned_bytes_ -= held.bytes;
  } else {
    pageable_bytes_ -= held.bytes;
  }
  memory_.free(base, held.bytes);
}

PinnedSegmentStats PinnedSegments::stats() const {
  return {pinned_bytes_.load(), pageable_bytes_.load(), num_pinnings_.load(),
          pinning_refused_.load(), peak_bytes_.load()};
}

}  // namespace stowage
