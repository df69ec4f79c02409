// CachingAllocator: stowage's caching device allocator, one per device.
//
// It serves malloc(size, stream) / free(ptr) from memory it obtains from a DeviceBackend and
// keeps after use, so steady-state training never calls the device. It is a lock around parts
// with one job each:
//   - BlockCache (block_cache.hpp): blocks, splitting and coalescing, the pools' free indexes,
//     stream-ordered reuse (Note [Stream-ordered reuse]);
//   - a MemorySource for the shared pool (memory_source.hpp): whole segments (SegmentSource) or,
//     where the device has virtual memory, pages (PagedSource, Note [Paged path]);
//   - ReserveBudget (Note [Reserve budget]): how far reserved memory may exceed the peak in use;
//   - MemoryLimit: the cap (memory fraction, limit); the allocated ceiling, a soft cap below it
//     (Note [Allocated ceiling]);
//   - LearnedPlacement (Note [Learned placement]), consulted before the dynamic path when on;
//   - PrivatePools (Note [Private pools]): CUDA graphs and torch MemPools;
//   - TraceRecorder: history and trace listeners; the statistics (stats.hpp).
// Requests are rounded to 512 B and served by the best-fitting free block of the same stream and
// size class (Note [Rounding], Note [Best fit]), split when the remainder is worth keeping (Note
// [Splitting]).
//
// Note [Miss path]
// A request of the large class first asks the learned layout for its block, when a layout is
// in force; then the shared pool's cache is searched. When no cached block fits, malloc
// tries, in order: the memory source's grow(); on the segment path, a wholly free segment it
// spared (Note [Splitting]); the layout's arena, given up (its free memory joins the shared pool)
// rather than fail; after waiting for pending frees, the cache again and, once unheld private
// pools have returned their free segments, the source's grow_again() (the segment source first
// returns wholly free segments, the paged source moves pages); private pools that lend their
// free blocks (use_on_oom); the registered MemoryPressureHandlers, called without the lock
// (eviction costs copies, so it comes after the cheap steps); and then raises OutOfMemory with a
// message that explains (Note [OOM message]), after recording an oom event and calling the OOM
// observers. Under a capture (Note [Private pools]) the steps after the spared segment are
// skipped: nothing waits and nothing goes back. The allocator is intact afterwards.
//
// Thread safety: every public function may be called from any thread; one std::mutex guards
// the state. The context provider, pressure handlers and OOM observers are called without it.
//
// Note [Stacks before the lock]
// The context provider (the Python layer, gathering a stack) may need the GIL. Torch releases
// the GIL around most ops, so a thread holding the allocator's lock and waiting for the GIL
// would deadlock with a thread holding the GIL and waiting for the lock. So the provider is
// called first, and the lock taken after.
//
// Note [Allocated ceiling]
// A soft cap on allocated bytes, for a caller that plans memory (stowage.plan holds a step to its
// budget with it). A request that would take allocated memory past the ceiling first asks the
// pressure handlers to let go of the excess, the offloader by waiting for its oldest
// offloads, which frees their device blocks; it is then served as usual, past the ceiling if
// nothing could be let go: the ceiling slows a request down, never fails it (the limit does).
// largest_available_block() counts only what fits under it, so prefetching stays under it too.
// Requests routed to a private pool ignore it (nothing may wait under a capture).
//
// Misuse on the free path (an unknown pointer, a double free, a size that is not the one
// requested) changes nothing, is counted in num_invalid_frees and logged; free never throws
// (torch frees from destructors).
//
// Ownership: the backend must outlive the allocator. The allocator owns its segments and
// returns the cached ones to the device when destroyed; blocks still allocated then are
// reported and their segments kept (freeing memory a caller still uses would be worse).
// Invariants: those of the BlockCache over every pool, and check_invariants' own (private pools
// never hold paged memory; the shared pool and the arena hold it exactly on the paged path; the
// arena's bookkeeping).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "allocator/block_cache.hpp"
#include "allocator/config.hpp"
#include "allocator/history.hpp"
#include "allocator/learned_placement.hpp"
#include "allocator/memory_limit.hpp"
#include "allocator/memory_pressure.hpp"
#include "allocator/oom_report.hpp"
#include "allocator/paged_source.hpp"
#include "allocator/pool.hpp"
#include "allocator/pool_checkpoint.hpp"
#include "allocator/private_pools.hpp"
#include "allocator/reserve_budget.hpp"
#include "allocator/segment_memory.hpp"
#include "allocator/segment_source.hpp"
#include "allocator/snapshot.hpp"
#include "allocator/stats.hpp"
#include "allocator/trace_recorder.hpp"
#include "device/backend.hpp"

namespace stowage {

class CachingAllocator final : private BlockCache::Listener {
 public:
  using OomObserver = std::function<void(const OomReport&)>;
  // Called before the lock is taken, when history is on, to tag events with the caller's stack.
  using ContextProvider = std::function<std::uint64_t()>;

  explicit CachingAllocator(DeviceBackend& backend, AllocatorConfig config = {});
  // Caches blocks of `memory` (not owned; it must outlive the allocator) instead of the
  // device's, on the segment path; the backend gives the streams and events of stream-ordered
  // reuse. virtual_memory:on and placement:learned are refused: they need device memory.
  CachingAllocator(DeviceBackend& backend, SegmentMemory& memory, AllocatorConfig config);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns device memory of at least `bytes` usable on `stream`; nullptr for 0 bytes. Throws
  // OutOfMemory when the request cannot be met (Note [Miss path]).
  void* malloc(std::size_t bytes, Stream stream = {});
  // Returns memory from malloc; nullptr is ignored. Never throws.
  void free(void* ptr) noexcept;
  // As free(ptr), from a caller that also passes back the size it asked malloc for (torch's
  // pluggable free hook). Another size means the pointer is not the allocation the caller
  // thinks it is: the block stays allocated (leaked, never handed to another tensor), and the
  // free is counted in num_invalid_frees and logged with both sizes.
  void free(void* ptr, std::size_t requested_bytes) noexcept;
  // `stream` uses the block at ptr as well; its free waits for that stream's work so far.
  void record_stream(void* ptr, Stream stream);
  // Waits for pending frees, then returns every wholly free cached segment (on the paged path,
  // every whole free page) to the device.
  void empty_cache();
  // As empty_cache, for the shared pool's whole segments of one size class only (the segment
  // path; pages of the paged path are left as they are).
  void release_free_segments(SizeClass size_class);

  // Caps reserved memory at fraction * device total (0 <= fraction <= 1; 0 refuses every
  // request that needs new memory, as torch allows).
  void set_memory_fraction(double fraction);
  // Caps reserved memory at `bytes` (AllocatorConfig::kUnlimited: no cap but the device's).
  void set_limit(std::size_t bytes);
  // The cap in force: the smaller of the two settings and the device's total.
  std::size_t limit() const;
  // Which of them it is, as messages name it (MemoryLimit::bound_name).
  std::string limit_bound() const;
  double memory_fraction() const;
  static constexpr std::size_t kNoCeiling = static_cast<std::size_t>(-1);
  // Note [Allocated ceiling]: `bytes` of allocated memory; kNoCeiling (the default) for none.
  void set_allocated_ceiling(std::size_t bytes) noexcept;
  std::size_t allocated_ceiling() const noexcept;

  DeviceStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();

  void record_history(bool enabled, std::size_t max_entries = History::kDefaultMaxEntries);
  // Providers replaced by a later call are kept until the allocator is destroyed (so readers
  // need no lock); set it once, or rarely.
  void set_context_provider(ContextProvider provider);
  AllocatorSnapshot snapshot() const;
  // History::recorded(): where the next event will be in the history's count.
  std::uint64_t history_recorded() const;
  bool history_enabled() const noexcept { return history_on_.load(std::memory_order_relaxed); }
  // Listeners hear of every event as it happens, history on or not, under the allocator's lock:
  // they must not call the allocator. Kept until the allocator is destroyed.
  using TraceListener = TraceRecorder::Listener;
  void add_trace_listener(TraceListener listener);

  // Marks the end of a training step (Note [Learned placement]); recorded in history. Cheap: call
  // it once per step whatever the configuration.
  void mark_step();
  // Records where stowage.fit's trial steps begin (`begin`) and end in the history (kFitTrialBegin,
  // kFitTrialEnd); nothing else changes.
  void mark_fit_trial(bool begin);
  using PlacementStatus = LearnedPlacement::Status;
  PlacementStatus placement_status() const;

  // Handlers are not owned; remove one before destroying it.
  void add_pressure_handler(MemoryPressureHandler* handler);
  void remove_pressure_handler(MemoryPressureHandler* handler);
  // Returns an id for remove_oom_observer.
  std::size_t add_oom_observer(OomObserver observer);
  void remove_oom_observer(std::size_t id);

  // --- private pools (Note [Private pools]); PoolId{0, 0} is not a private pool ---
  using StreamFilter = PrivatePools::StreamFilter;
  // Creates pool `id` with one holder, or adds a holder to it.
  void create_or_incref_pool(PoolId id);
  // Adds a holder to pool `id` (creating it) and routes requests on streams `filter` accepts
  // to it until end_allocate_to_pool(id). The filter is called under the allocator's lock.
  void begin_allocate_to_pool(PoolId id, StreamFilter filter);
  void end_allocate_to_pool(PoolId id);
  // Drops a holder; at zero the pool's memory goes back to the device as it becomes free.
  void release_pool(PoolId id);
  // Returns the wholly free segments of pool `id` to the device, held or not (torch's
  // emptyCache(pool)); false if none or no such pool.
  bool release_pool_cache(PoolId id);
  // The pool's holders; 0 for a pool that does not exist.
  int pool_use_count(PoolId id) const;
  // With use_on_oom, the pool's free blocks serve requests from outside it that would
  // otherwise fail (after every other step of the miss path). With no_split, its blocks are
  // handed out whole. Both throw LogicError for a pool that does not exist.
  void set_pool_use_on_oom(PoolId id, bool use_on_oom);
  void set_pool_no_split(PoolId id);
  // The allocated blocks of pool `id`, in address order.
  std::vector<void*> pool_allocations(PoolId id) const;
  PoolCheckpoint checkpoint_pool(PoolId id) const;
  // Frees every allocation of the checkpoint's pool and allocates again those that were
  // allocated at the checkpoint, at the same addresses. Throws LogicError when the pool's
  // segments no longer match the checkpoint (nothing changed then).
  PoolRestore restore_pool(const PoolCheckpoint& checkpoint);

  // The size of the block holding an allocated pointer (its rounded size), or 0 if unknown.
  std::size_t block_size(const void* ptr) const;
  // The device memory range an allocated pointer lies in (its segment, or on the paged path its
  // run of mapped pages): {base, bytes}; {nullptr, 0} for a pointer this allocator did not give.
  std::pair<void*, std::size_t> base_allocation(const void* ptr) const;
  // The largest request that can be served now without waiting: the largest cached block of the
  // shared pool's large class, or what the device and the limit would still give, whichever is
  // larger; no more than the allocated ceiling leaves, when one is set.
  std::size_t largest_available_block() const;
  DeviceBackend& backend() const noexcept { return backend_; }
  const AllocatorConfig& config() const noexcept { return config_; }

  // Throws InternalError if any invariant is broken. O(blocks).
  void check_invariants() const;

  // For pthread_atfork: hold the lock across fork() so the child never inherits it held by a
  // thread that does not exist there. prepare_fork() takes it; after_fork() (parent and child)
  // releases it.
  void prepare_fork() { mutex_.lock(); }
  void after_fork() { mutex_.unlock(); }

 private:
  // BlockCache::Listener: a block of a private pool nobody holds goes back with its segment.
  void block_freed(Block& block) override;

  // Segments come from `memory`, or from `owned` (the device's) when memory is nullptr.
  CachingAllocator(DeviceBackend& backend, std::unique_ptr<DeviceSegments> owned,
                   SegmentMemory* memory, AllocatorConfig config);

  Block* try_malloc_locked(std::size_t bytes, std::size_t rounded, Stream stream,
                           std::uint64_t context);
  // Note [Miss path] for the shared pool, after the layout and the cache; `fresh` is set when the
  // block was just formed by the memory source, `commit_when_served` cleared when the layout was
  // given up.
  Block* miss_locked(const GrowRequest& request, bool oversize, bool& fresh,
                     bool& commit_when_served);
  // The best-fitting cached block of `pool` for the request, out of its index, or nullptr. With
  // `spare_whole_segments`, a wholly free segment much larger than the request is passed over
  // (Note [Splitting]).
  Block* find_cached_locked(Pool& pool, const GrowRequest& request, bool oversize,
                            bool spare_whole_segments = false);
  // `fresh`: the block was just formed by the memory source.
  Block* claim_locked(Block* block, std::size_t bytes, std::size_t rounded, bool oversize,
                      bool fresh, std::uint64_t context);
  // free(ptr) and free(ptr, size); `requested_bytes` is checked when it has a value.
  void free_checked(void* ptr, std::optional<std::size_t> requested_bytes) noexcept;
  // Returns every wholly free segment (and, paged, every whole free page) to the device.
  bool release_cached_locked();
  OomReport oom_report_locked(std::size_t bytes, std::size_t rounded, Stream stream);
  // What the memory sources work with.
  SourceParts parts() noexcept {
    return {backend_, segment_memory_, cache_, stats_, trace_, limit_, budget_, shared_,
            config_.max_split_size, config_.move_pages_above};
  }
  std::uint64_t context_for_history() const noexcept;
  // Note [Allocated ceiling]: asks the pressure handlers to let go of what a request of `rounded`
  // bytes would take past the ceiling. Without the lock.
  void relieve_above_ceiling(std::size_t rounded, Stream stream);

  DeviceBackend& backend_;
  const std::unique_ptr<DeviceSegments> device_segments_;  // when segments are the device's
  SegmentMemory& segment_memory_;                          // the segment path's memory
  const AllocatorConfig config_;
  // Read before the lock is taken (Note [Stacks before the lock]).
  std::atomic<bool> history_on_{false};
  // Read without a lock: replaced providers stay alive in providers_ until the allocator is
  // destroyed. (std::atomic<std::shared_ptr> would take an internal spin lock, which fork()
  // can inherit held.)
  std::atomic<const ContextProvider*> context_provider_{nullptr};
  std::atomic<std::size_t> allocated_ceiling_{kNoCeiling};  // read before the lock is taken

  mutable std::mutex mutex_;  // guards everything below
  DeviceStats stats_;
  StepCalls step_start_;  // the device-call counters when the step began (last mark_step)
  TraceRecorder trace_;
  MemoryLimit limit_;
  BlockCache cache_;
  Pool shared_;
  ReserveBudget budget_;
  SegmentSource segments_;               // the shared pool's source without virtual memory;
  std::unique_ptr<PagedSource> paged_;   // with it (Note [Paged path]); private pools use segments
  MemorySource& source_;                 // the shared pool's
  const bool spare_whole_segments_;      // source_.spares_whole_segments()
  const bool splits_fresh_blocks_;       // source_.splits_fresh_blocks()
  std::unique_ptr<LearnedPlacement> placement_;  // placement:learned on the paged path
  PrivatePools private_pools_;
  std::vector<MemoryPressureHandler*> pressure_handlers_;
  std::map<std::size_t, OomObserver> oom_observers_;
  std::vector<std::unique_ptr<const ContextProvider>> providers_;  // every provider ever set
  std::size_t next_observer_id_ = 1;
};

}  // namespace stowage
