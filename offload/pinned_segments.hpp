// PinnedSegments: segments of page-locked host memory near the GPU, for the pinned host pool.
//
// A segment is NumaHostMemory (on the NUMA nodes nearest the GPU) pinned with the device's
// register_host (cudaHostRegister), so copies between it and the device run at the link's full
// speed and overlap compute. When the host refuses to pin (ulimit -l, no memory left to lock),
// the segment stays pageable: copies still work, slower and with less overlap. One warning says
// so, and from then on segments are not pinned (each refused attempt costs a system call that
// touches every page, and the host's answer will not change while the pool holds its memory).
//
// Sizes: blocks of the small class share 2 MiB segments (Note [Rounding]); a larger block gets a
// segment of its own size rounded to host pages, not to the device's 2 MiB, so the pool's
// footprint follows the bytes it holds.
//
// Contract: thread-safe: the pool's two CachingAllocators (its step blocks' and its resident
// blocks', Note [One pinned arena]) call it each under its own lock, so it holds a lock of its
// own around its map and its limit check; the counters are atomics so stats() may be read from
// any thread. The limit counts the segments of both. Owns its segments: they go back to the host
// when the pool frees them or, at the latest, when this object is destroyed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "allocator/segment_memory.hpp"
#include "device/backend.hpp"
#include "device/numa_host_memory.hpp"

namespace stowage {

struct PinnedSegmentStats {
  std::size_t pinned_bytes = 0;    // held and page-locked
  std::size_t pageable_bytes = 0;  // held but pageable (pinning was refused)
  std::int64_t num_pinnings = 0;   // segments pinned so far (register_host calls that succeeded)
  bool pinning_refused = false;    // the host refused to pin once: new segments are pageable
  std::size_t peak_bytes = 0;      // the most held at once (pinned and pageable)
};

class PinnedSegments final : public SegmentMemory {
 public:
  // Holds at most `limit_bytes` (0: the host's physical memory).
  PinnedSegments(DeviceBackend& backend, NumaHostMemory memory, std::size_t limit_bytes);
  ~PinnedSegments() override;
  PinnedSegments(const PinnedSegments&) = delete;
  PinnedSegments& operator=(const PinnedSegments&) = delete;

  void* try_allocate(std::size_t bytes) override;
  void free(void* base) override;
  SegmentSizes sizes_for(std::size_t rounded) const override;
  std::size_t total_bytes() const override { return limit_bytes_; }
  std::size_t free_bytes() override;
  std::string name() const override { return "pinned host memory"; }
  MemoryNames names() const override { return {"CPU", "Pinned host memory"}; }

  PinnedSegmentStats stats() const;
  // Where the memory is placed ("NUMA node 1", "anywhere (...)").
  std::string placement() const { return memory_.placement(); }

 private:
  struct Held {
    std::size_t bytes = 0;
    bool pinned = false;
  };
  void release(void* base, const Held& held) noexcept;

  DeviceBackend& backend_;
  NumaHostMemory memory_;
  const std::size_t limit_bytes_;
  std::mutex mutex_;  // guards held_ and makes try_allocate's limit check and growth one step
  std::map<void*, Held> held_;
  std::atomic<std::size_t> pinned_bytes_{0};
  std::atomic<std::size_t> pageable_bytes_{0};
  std::atomic<std::int64_t> num_pinnings_{0};
  std::atomic<bool> pinning_refused_{false};
  std::atomic<std::size_t> peak_bytes_{0};
};

}  // namespace stowage
