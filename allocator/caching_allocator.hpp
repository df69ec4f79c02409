// CachingAllocator: stowage's caching device allocator, one per device.
//
// It serves malloc(size, stream) / free(ptr) from segments it obtains from a DeviceBackend and
// keeps after use, so steady-state training never calls the device: requests are rounded to
// 512 B and served from a small pool (<= 1 MiB, packed into 2 MiB segments) or a large pool
// (Note [Rounding]); the best-fitting free block of the same stream is taken (Note [Best fit])
// and split when the remainder is worth keeping (Note [Splitting]); freed blocks coalesce with
// free neighbours.
//
// Streams (Note [Stream-ordered reuse]): a block is reusable on its own stream as soon as it is
// freed, because work on one stream runs in order. record_stream(ptr, s) says another stream s
// uses the block too; then free records an event on s and the block stays pending until the
// event completes. Completed events are found by querying, never by waiting, so malloc does not
// block on them.
//
// Note [Miss path]
// When no cached block fits, malloc tries, in order: a new segment from the device (within the
// limit); releasing every wholly free cached segment (after waiting for pending frees) and
// asking the device again; the registered MemoryPressureHandlers, called without the lock
// (eviction costs copies, so it comes after the cheap steps); and then raises OutOfMemory with
// a message that explains (Note [OOM message]), after recording an oom event and calling the
// OOM observers. The allocator is intact afterwards.
//
// Thread safety: every public function may be called from any thread; one std::mutex guards
// the state. The context provider, pressure handlers and OOM observers are called without it.
//
// Note [Stacks before the lock]
// The context provider (the Python layer, gathering a stack) may need the GIL. Torch releases
// the GIL around most ops, so a thread holding the allocator's lock and waiting for the GIL
// would deadlock with a thread holding the GIL and waiting for the lock. So the provider is
// called first, and the lock taken after.
// Misuse on the free path (an unknown pointer, a double free) changes nothing, is counted in
// num_invalid_frees and logged; free never throws (torch frees from destructors).
//
// Ownership: the backend must outlive the allocator. The allocator owns its segments and
// returns the cached ones to the device when destroyed; blocks still allocated then are
// reported and their segments kept (freeing memory a caller still uses would be worse).
//
// Invariant (check_invariants), per pool and in total:
//   reserved_bytes == allocated_bytes + pending-free bytes + free (cached) bytes
// and active_bytes == allocated_bytes + pending-free bytes; blocks tile each segment exactly;
// the free index holds exactly the free blocks, the address map exactly the allocated ones.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "allocator/backend.hpp"
#include "allocator/block.hpp"
#include "allocator/block_arena.hpp"
#include "allocator/block_map.hpp"
#include "allocator/config.hpp"
#include "allocator/free_block_index.hpp"
#include "allocator/history.hpp"
#include "allocator/memory_pressure.hpp"
#include "allocator/oom_report.hpp"
#include "allocator/snapshot.hpp"
#include "allocator/stats.hpp"

namespace stowage {

class CachingAllocator {
 public:
  using OomObserver = std::function<void(const OomReport&)>;
  // Called before the lock is taken, when history is on, to tag events with the caller's stack.
  using ContextProvider = std::function<std::uint64_t()>;

  explicit CachingAllocator(DeviceBackend& backend, AllocatorConfig config = {});
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns device memory of at least `bytes` usable on `stream`; nullptr for 0 bytes. Throws
  // OutOfMemory when the request cannot be met (Note [Miss path]).
  void* malloc(std::size_t bytes, Stream stream = {});
  // Returns memory from malloc; nullptr is ignored. Never throws.
  void free(void* ptr) noexcept;
  // `stream` uses the block at ptr as well; its free waits for that stream's work so far.
  void record_stream(void* ptr, Stream stream);
  // Waits for pending frees, then returns every wholly free cached segment to the device.
  void empty_cache();

  // Caps reserved memory at fraction * device total (0 < fraction <= 1).
  void set_memory_fraction(double fraction);
  // Caps reserved memory at `bytes` (AllocatorConfig::kUnlimited: no cap but the device's).
  void set_limit(std::size_t bytes);
  // The cap in force: the smaller of the two settings and the device's total.
  std::size_t limit() const;

  DeviceStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();

  void record_history(bool enabled, std::size_t max_entries = History::kDefaultMaxEntries);
  // Providers replaced by a later call are kept until the allocator is destroyed (so readers
  // need no lock); set it once, or rarely.
  void set_context_provider(ContextProvider provider);
  AllocatorSnapshot snapshot() const;

  // Handlers are not owned; remove one before destroying it.
  void add_pressure_handler(MemoryPressureHandler* handler);
  void remove_pressure_handler(MemoryPressureHandler* handler);
  // Returns an id for remove_oom_observer.
  std::size_t add_oom_observer(OomObserver observer);
  void remove_oom_observer(std::size_t id);

  // The size of the block holding an allocated pointer (its rounded size), or 0 if unknown.
  std::size_t block_size(const void* ptr) const;
  DeviceBackend& backend() const noexcept { return backend_; }
  const AllocatorConfig& config() const noexcept { return config_; }

  // Throws InternalError if any invariant above is broken. O(blocks).
  void check_invariants() const;

  // For pthread_atfork: hold the lock across fork() so the child never inherits it held by a
  // thread that does not exist there. prepare_fork() takes it; after_fork() (parent and child)
  // releases it.
  void prepare_fork() { mutex_.lock(); }
  void after_fork() { mutex_.unlock(); }

 private:
  struct PendingEvent {
    Event event;
    Block* block;
  };

  FreeBlockIndex& index_of(Pool pool) noexcept { return pools_[pool == Pool::kSmall ? 0 : 1]; }

  Block* try_malloc_locked(std::size_t bytes, std::size_t rounded, Stream stream,
                           std::uint64_t context);
  Block* find_cached_locked(Pool pool, Stream stream, std::size_t rounded, bool oversize);
  Block* allocate_segment_locked(Pool pool, Stream stream, std::size_t rounded,
                                 std::uint64_t context);
  Block* claim_locked(Block* block, std::size_t bytes, std::size_t rounded, bool oversize,
                      std::uint64_t context);
  void free_block_locked(Block* block);
  void release_segment_locked(Segment& segment);
  // Returns every wholly free segment to the device; true if any was released.
  bool release_cached_locked();
  void process_events_locked();
  void synchronize_pending_locked();
  Event acquire_event_locked();
  // Adds (sign +1) or removes (-1) a free block's contribution to the inactive_split stats.
  void count_inactive_split_locked(const Block& block, int sign);
  void record_locked(TraceAction action, std::uintptr_t address, std::size_t size, Stream stream,
                     std::uint64_t context);
  OomReport oom_report_locked(std::size_t bytes, std::size_t rounded, Stream stream);
  std::size_t limit_locked() const;
  std::uint64_t context_for_history() const noexcept;

  DeviceBackend& backend_;
  const AllocatorConfig config_;
  // Read before the lock is taken (Note [Stacks before the lock]).
  std::atomic<bool> history_on_{false};
  // Read without a lock: replaced providers stay alive in providers_ until the allocator is
  // destroyed. (std::atomic<std::shared_ptr> would take an internal spin lock, which fork()
  // can inherit held.)
  std::atomic<const ContextProvider*> context_provider_{nullptr};

  mutable std::mutex mutex_;  // guards everything below
  BlockArena arena_;
  FreeBlockIndex pools_[2];                 // small, large
  BlockMap allocated_;                      // allocated blocks by address
  std::map<std::uintptr_t, Segment> segments_;  // by base address
  std::vector<PendingEvent> pending_events_;
  std::vector<Event> spare_events_;
  DeviceStats stats_;
  History history_;
  std::size_t limit_bytes_;
  double memory_fraction_;
  std::vector<MemoryPressureHandler*> pressure_handlers_;
  std::map<std::size_t, OomObserver> oom_observers_;
  std::vector<std::unique_ptr<const ContextProvider>> providers_;  // every provider ever set
  std::size_t next_observer_id_ = 1;
};

}  // namespace stowage
