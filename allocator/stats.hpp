// Allocator statistics, with PyTorch's memory_stats() names and meanings.
//
// Each Stat has current, peak, allocated (sum of increases) and freed (sum of decreases), kept
// for all blocks together and for the small and large size classes apart (torch's "small_pool"
// and "large_pool"). What is counted:
//   allocation / allocated_bytes   blocks handed to callers and not yet freed by them
//   requested_bytes                the bytes callers asked for (before rounding) of those blocks
//   active / active_bytes          allocated blocks plus freed blocks still waiting for streams
//   segment / reserved_bytes       segments obtained from the device
//   inactive_split / _bytes        free blocks in segments that are split (so not releasable)
//   oversize_allocations/segments  allocations / segments of max_split_size or more
// plus counters: num_alloc_retries (cache released and allocation retried), num_ooms,
// num_sync_all_streams, num_device_alloc, num_device_free, and stowage's num_invalid_frees
// (frees of unknown pointers and double frees, which change nothing else).
// On the paged path (Note [Paged path]) reserved_bytes counts mapped physical pages,
// num_device_alloc / num_device_free count physical pages created and released, and a segment is
// an address reservation. stowage adds mapped_pages (current, peak: the live mappings) and
// the counters num_maps / num_unmaps (pages mapped and unmapped), num_device_calls and
// device_call_ns (the memory-management calls the allocator made to the device: segments,
// reservations, pages created and released, maps, set_access, unmaps, the synchronisations
// before pages move; and the host time they took), num_steps (mark_step calls) and last_step
// (those counters over the last step, between the last two mark_step calls).
//
// Contract: plain values; the parts of one allocator update them under its lock (the block cache
// the block counts, the memory sources the segment, reserved and page counts) and the allocator
// returns copies.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "allocator/size_policy.hpp"

namespace stowage {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void update(std::int64_t amount) noexcept {
    current += amount;
    if (current > peak) peak = current;
    if (amount > 0) allocated += amount;
    if (amount < 0) freed -= amount;
  }
  void reset_peak() noexcept { peak = current; }
  void reset_accumulated() noexcept { allocated = freed = 0; }
};

// One Stat for all size classes, then the small class, then the large class (torch's order).
struct SizeClassStats {
  std::array<Stat, 3> stats;

  Stat& all() noexcept { return stats[0]; }
  const Stat& all() const noexcept { return stats[0]; }
  Stat& of(SizeClass size_class) noexcept { return stats[1 + index_of(size_class)]; }
  const Stat& of(SizeClass size_class) const noexcept { return stats[1 + index_of(size_class)]; }
  // Updates the stat of all classes and the class's.
  void update(SizeClass size_class, std::int64_t amount) noexcept {
    stats[0].update(amount);
    of(size_class).update(amount);
  }
};

// What the allocator asked of the device over one step.
struct StepCalls {
  std::int64_t maps = 0;    // pages mapped
  std::int64_t unmaps = 0;  // pages unmapped
  std::int64_t device_calls = 0;
  std::int64_t device_call_ns = 0;
};

struct DeviceStats {
  SizeClassStats allocation;
  SizeClassStats segment;
  SizeClassStats active;
  SizeClassStats inactive_split;
  SizeClassStats allocated_bytes;
  SizeClassStats reserved_bytes;
  SizeClassStats active_bytes;
  SizeClassStats inactive_split_bytes;
  SizeClassStats requested_bytes;
  Stat oversize_allocations;
  Stat oversize_segments;
  Stat mapped_pages;
  std::int64_t num_maps = 0;
  std::int64_t num_unmaps = 0;
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_sync_all_streams = 0;
  std::int64_t num_device_alloc = 0;
  std::int64_t num_device_free = 0;
  std::int64_t num_invalid_frees = 0;
  std::int64_t num_device_calls = 0;
  std::int64_t device_call_ns = 0;
  std::int64_t num_steps = 0;
  StepCalls last_step;
  std::int64_t max_split_size = -1;  // bytes; -1 when unlimited

  // The counters of StepCalls as they stand now (since the last reset).
  StepCalls calls_so_far() const noexcept {
    return {num_maps, num_unmaps, num_device_calls, device_call_ns};
  }

  void reset_peak() noexcept;
  void reset_accumulated() noexcept;
};

// The stats as torch.cuda.memory_stats() flattens them: "allocated_bytes.all.current", ...,
// "num_ooms", "max_split_size", plus stowage's own ("num_invalid_frees", "last_step.num_maps",
// ...). Sorted by key.
std::vector<std::pair<std::string, std::int64_t>> memory_stats_entries(const DeviceStats& stats);

}  // namespace stowage
