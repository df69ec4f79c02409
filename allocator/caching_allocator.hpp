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
// Note [Segment headroom]
// On the segment path a freed segment can serve only what fits in it, so a cache built by one
// phase of a step (big blocks) is dead weight for another (other sizes) and reserved drifts far
// above the peak in use (1.12-1.34x on the recorded traces). So, before a new segment would take
// reserved beyond (1 + reserve_headroom) x the most bytes ever active, the wholly free cached
// segments go back to the device first (after waiting for pending frees; on a GPU, cudaFree
// also waits for the device). A loop that keeps returning and asking again churns: each time
// it has returned an eighth of its peak without the peak rising, the allowance grows by 1% of
// the peak, until its layout fits and the calls stop. reserve_headroom:1 turns this off.
//
// Note [Paged pool]
// When the device has virtual memory (and virtual_memory is not off), both pools are paged:
// each (pool, stream) has an address reservation (a paged segment), and physical memory comes
// in pages of the device's granularity (2 MiB on current GPUs) that blocks share, so requests
// keep their 512 B rounding and reserved bytes are exactly the pages mapped. Free blocks over
// mapped pages are the cache, found by best fit as on the segment path; address space with no
// pages under it forms "holes" (Note in block.hpp). On a miss the allocator maps pages into a
// hole, choosing whichever of two holes needs fewer new pages:
//   - the best-fitting hole; or
//   - the stream's largest hole, normally the unmapped tail of its reservation.
// A hole right after a free mapped block extends that block, so the request needs pages only
// for what the block lacks: the reservation grows at its end like PyTorch's expandable
// segments, and a batch that grows by one row costs one page instead of a new segment per layer.
// Pages come, in order, from:
//   1. new physical memory, while reserved stays within (1 + reserve_headroom) x the most bytes
//      ever active (so the forward pass grows the reserve at its tail, and later misses move
//      pages rather than add them);
//   2. stitching: the whole pages of free mapped blocks anywhere (any stream, either pool,
//      largest blocks first, each block's pages all at once unless that is far more than
//      missing) are unmapped and mapped into the hole, the surplus after the request as
//      cache; so a request that fits in the total free memory never fails for want of a
//      contiguous range, and free memory gathers at the growth front instead of being chopped
//      into slivers. The owner stream of a moved page is
//      synchronised first: its queued work may still use the page;
//   3. new physical memory up to the limit.
// Ranges built this way stay mapped and cached after their blocks are freed, so a training
// loop that repeats its allocations finds them again. A loop whose layout still makes it move
// pages step after step is caught by counting: each time stitching has moved an eighth as many
// pages as the most ever in use, without that peak rising, the allowance for new pages grows
// by 1% of the peak, until the layout fits and the moves stop; so steady training makes no map or unmap
// calls once warm, at the cost of a little memory only where the layout needs it. Live
// mappings are bounded by reserved bytes / page size. empty_cache unmaps and releases every
// page under free mapped blocks and returns reservations with nothing mapped; the miss path
// does not (stitching already uses those pages).
//
// Note [Learned placement]
// Training repeats the same allocations every step. With placement:learned (paged path only) a
// StepLearner (step_learner.hpp) watches the large pool's requests on one stream until a step
// has repeated (stowage.mark_step() marks steps; without marks the repetition is found in the
// sequence), and plans an address for every allocation of the step that lives less than a step,
// by packing their recorded lifetimes (placement_plan.hpp). The plan's step starts at the mark,
// or (found without marks) after the point with the fewest bytes live, where a step boundary
// lies; requests before it stay dynamic. There the plan gets an arena: an address reservation
// of its own whose free blocks are kept apart from the dynamic pools, in an index by address.
// The dynamic cache gives its whole free pages back and the arena is mapped whole (new pages
// within the headroom, else stitched, as on a miss), so nothing is mapped twice over and no page
// moves afterwards. From then on the k-th request of the step is cut out of the arena at its
// planned offset. Requests the plan leaves dynamic (long-lived
// ones) take the dynamic path. The moment a request differs from the plan (another size, a step
// marked early) or its planned range is not free (a free came later than recorded, a
// record_stream still pending), the plan is dropped: the arena's free blocks join the dynamic
// pools, its live blocks stay where they are, and learning starts again. empty_cache drops the
// plan too. The learner bounds what it keeps and stops after repeated departures.
//
// Note [Private pools]
// A private pool sets memory apart for one owner: a CUDA graph being captured (its replays reuse
// the addresses it captured, so no one else may take them), or a torch MemPool. Between
// begin_allocate_to_pool(id, filter) and end_allocate_to_pool(id), requests on streams the
// filter accepts are served from pool `id` alone: its own free blocks, else a new segment that
// belongs to it (private pools use the segment path, never the paged one, so their memory
// never moves). Their blocks, once freed, go back to that pool's free lists only. Holders share
// a pool through its use count (create_or_incref_pool, release_pool); when it reaches zero the
// pool's wholly free segments go back to the device, and the rest follow as their blocks are
// freed. While any capture is under way the allocator makes no call a capture forbids: it
// neither queries nor waits for events (frees that need events wait until the capture ends),
// nor synchronises to move pages; a miss it cannot serve without those is an OutOfMemory.
// checkpoint_pool / restore_pool save a pool's layout and return to it (torch's cudagraph
// trees).
//
// Thread safety: every public function may be called from any thread; one std::mutex guards
// the state. The context provider, pressure handlers and OOM observers are called without it.
//
// Note [Stacks before the lock]
// The context provider (the Python layer, gathering a stack) may need the GIL. Torch releases
// the GIL around most ops, so a thread holding the allocator's lock and waiting for the GIL
// would deadlock with a thread holding the GIL and waiting for the lock. So the provider is
// called first, and the lock taken after.
// Misuse on the free path (an unknown pointer, a double free, a size that is not the one
// requested) changes nothing, is counted in num_invalid_frees and logged; free never throws
// (torch frees from destructors).
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
#include <optional>
#include <utility>
#include <vector>

#include "allocator/device/backend.hpp"
#include "allocator/block.hpp"
#include "allocator/block_arena.hpp"
#include "allocator/block_map.hpp"
#include "allocator/config.hpp"
#include "allocator/free_block_index.hpp"
#include "allocator/history.hpp"
#include "allocator/memory_pressure.hpp"
#include "allocator/oom_report.hpp"
#include "allocator/private_pool.hpp"
#include "allocator/snapshot.hpp"
#include "allocator/stats.hpp"
#include "allocator/step_learner.hpp"

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
  // As free(ptr), from a caller that also passes back the size it asked malloc for (torch's
  // pluggable free hook). Another size means the pointer is not the allocation the caller
  // thinks it is: the block stays allocated (leaked, never handed to another tensor), and the
  // free is counted in num_invalid_frees and logged with both sizes.
  void free(void* ptr, std::size_t requested_bytes) noexcept;
  // `stream` uses the block at ptr as well; its free waits for that stream's work so far.
  void record_stream(void* ptr, Stream stream);
  // Waits for pending frees, then returns every wholly free cached segment to the device.
  void empty_cache();

  // Caps reserved memory at fraction * device total (0 <= fraction <= 1; 0 refuses every
  // request that needs new memory, as torch allows).
  void set_memory_fraction(double fraction);
  // Caps reserved memory at `bytes` (AllocatorConfig::kUnlimited: no cap but the device's).
  void set_limit(std::size_t bytes);
  // The cap in force: the smaller of the two settings and the device's total.
  std::size_t limit() const;
  double memory_fraction() const;

  DeviceStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();

  void record_history(bool enabled, std::size_t max_entries = History::kDefaultMaxEntries);
  // Providers replaced by a later call are kept until the allocator is destroyed (so readers
  // need no lock); set it once, or rarely.
  void set_context_provider(ContextProvider provider);
  AllocatorSnapshot snapshot() const;
  bool history_enabled() const noexcept { return history_on_.load(std::memory_order_relaxed); }
  // Listeners hear of every event as it happens, history on or not, under the allocator's lock:
  // they must not call the allocator. Kept until the allocator is destroyed.
  using TraceListener = std::function<void(const TraceEntry&)>;
  void add_trace_listener(TraceListener listener);

  // Marks the end of a training step (Note [Learned placement]); recorded in history. Cheap: call
  // it once per step whatever the configuration.
  void mark_step();
  struct PlacementStatus {
    bool enabled = false;           // placement:learned on the paged path
    StepLearner::Phase phase = StepLearner::Phase::kLearning;
    std::size_t plans_made = 0;
    int departures = 0;
    std::size_t arena_bytes = 0;    // the plan in force's arena (0: none)
    std::size_t plan_live_bytes = 0;  // its allocations' most bytes live at once (packing bound)
    std::size_t planned_allocations = 0;  // requests served at a planned address, ever
  };
  PlacementStatus placement_status() const;

  // Handlers are not owned; remove one before destroying it.
  void add_pressure_handler(MemoryPressureHandler* handler);
  void remove_pressure_handler(MemoryPressureHandler* handler);
  // Returns an id for remove_oom_observer.
  std::size_t add_oom_observer(OomObserver observer);
  void remove_oom_observer(std::size_t id);

  // --- private pools (Note [Private pools]); PoolId{0, 0} is not a private pool ---
  using StreamFilter = std::function<bool(Stream)>;
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
  // shared large pool, or what the device and the limit would still give, whichever is larger.
  std::size_t largest_available_block() const;
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

  FreeBlockIndex& index_of(Pool pool, PrivatePool* owner = nullptr) noexcept {
    return owner != nullptr ? owner->index(pool) : pools_[pool == Pool::kSmall ? 0 : 1];
  }
  FreeBlockIndex& holes_of(Pool pool) noexcept { return holes_[pool == Pool::kSmall ? 0 : 1]; }
  // The index a free block belongs in: its private pool's, its pool's cache, or its pool's
  // holes when unmapped.
  FreeBlockIndex& index_for(const Block& block) noexcept {
    if (block.segment->planned) return plan_arena_;
    return block.mapped ? index_of(block.segment->pool, block.segment->owner)
                        : holes_of(block.segment->pool);
  }

  Block* try_malloc_locked(std::size_t bytes, std::size_t rounded, Stream stream,
                           std::uint64_t context);
  Block* find_cached_locked(Pool pool, Stream stream, std::size_t rounded, bool oversize,
                            PrivatePool* owner = nullptr, bool spare_whole_segments = false);
  // Segment path: before a new segment of `size` takes reserved beyond the headroom, returns the
  // wholly free cached segments (Note [Segment headroom]).
  void release_beyond_headroom_locked(std::size_t size, std::size_t rounded);
  Block* allocate_segment_locked(Pool pool, Stream stream, std::size_t rounded,
                                 std::uint64_t context, PrivatePool* owner = nullptr);
  // Marks a free, unindexed block allocated for `bytes` and counts it.
  void mark_allocated_locked(Block* block, std::size_t bytes, bool oversize,
                             std::uint64_t context);
  // free(ptr) and free(ptr, size); `requested_bytes` is checked when it has a value.
  void free_checked(void* ptr, std::optional<std::size_t> requested_bytes) noexcept;
  // Takes an allocated block out of the address map and the allocation counts (free's first
  // half; the block is then pending or freed by the caller).
  void end_allocation_locked(Block* block, std::uint64_t context);
  // Makes a freed block wait for events on the streams recorded with record_stream, or frees
  // it at once when it has none.
  void await_stream_uses_locked(Block* block);

  // Private pools (caching_allocator_pools.cpp).
  bool capturing() const noexcept { return !captures_.empty(); }
  PrivatePool* capture_pool_locked(Stream stream) const;
  PrivatePool* find_pool_locked(PoolId id) const;
  PrivatePool& create_or_incref_pool_locked(PoolId id);
  // Returns the wholly free segments of pools nobody holds (all of them when `all` is set) and
  // forgets pools left empty; true if any segment was returned.
  bool release_private_segments_locked(bool all);
  // Frees that waited for a capture to end.
  void flush_deferred_frees_locked();
  // `fresh`: the block was just formed by the paged path (its remainder may be split off even
  // for an oversize request).
  // Records a segment (paged: an address reservation) over [base, base + size) and the one
  // free block spanning it (unmapped when paged); throws with nothing recorded on failure.
  Block* add_segment_locked(std::uintptr_t base, std::size_t size, Stream stream, Pool pool,
                            std::uint64_t context, bool paged);
  // Cuts `block` after its first `keep` bytes (0 < keep < size); the rest goes to `rest`, a
  // fresh block from the arena, linked after it with the same stream, segment and mapping.
  // Neither is indexed or counted here.
  static void split_after_locked(Block* block, std::size_t keep, Block* rest) noexcept;
  Block* claim_locked(Block* block, std::size_t bytes, std::size_t rounded, bool oversize,
                      bool fresh, std::uint64_t context);
  void free_block_locked(Block* block);
  // Indexes a free block after coalescing it with free neighbours of the same kind (mapped or
  // unmapped); returns the coalesced block.
  Block* insert_free_locked(Block* block);

  // The paged path (Note [Paged pool]; caching_allocator_paged.cpp).
  Block* grow_paged_locked(Pool pool, Stream stream, std::size_t rounded, std::uint64_t context);
  Block* reserve_paged_locked(Pool pool, Stream stream, std::size_t rounded,
                              std::uint64_t context);
  bool create_page_locked(std::vector<PhysicalHandle>& out);
  // Adds `count` pages to `handles`: new memory while reserved stays within the headroom (for a
  // request of `rounded` bytes), then stitching from free mapped blocks other than `keep`, then
  // new memory up to the limit. False (handles partly filled) when that is not enough.
  bool gather_pages_locked(std::size_t count, std::size_t rounded, const Block* keep,
                           std::vector<PhysicalHandle>& handles);
  // Maps `handles` at `start` and makes them accessible. On failure, undoes what it can: the
  // handles that stay mapped (not undone) remain in `handles`, the rest are released; returns
  // false.
  bool map_pages_locked(std::uintptr_t start, std::vector<PhysicalHandle>& handles);
  // Learned placement (Note [Learned placement]; caching_allocator_placement.cpp).
  // The block the plan gives this request, or nullptr: then commit_when_served says whether the
  // dynamic path serves a request the plan expects (commit it once served).
  Block* place_planned_locked(std::size_t rounded, Stream stream, std::uint64_t context,
                              bool& commit_when_served);
  void learn_malloc_locked(Block* block, std::size_t rounded, Stream stream);
  // Opens the arena of the plan taken (taken_plan_); false (nothing kept) if it cannot.
  bool open_arena_locked(Stream stream, std::uint64_t context);
  void dissolve_arena_locked();
  // Maps the unmapped pages of the arena in [first, last) (page-aligned); false if it could not.
  bool map_arena_range_locked(std::uintptr_t first, std::uintptr_t last, std::uint64_t context);
  // Records `handles`, just mapped and made accessible at the start of `hole`, and makes them
  // cache joined to the free mapped block before the hole; returns that cached block (indexed).
  Block* adopt_mapped_pages_locked(Block* hole, const std::vector<PhysicalHandle>& handles,
                                   std::uint64_t context);
  // Unmaps whole pages of free mapped blocks other than `keep`, largest blocks first, until at
  // least `count` pages have been added to `out`; returns how many were added.
  std::size_t steal_pages_locked(std::size_t count, const Block* keep,
                                 std::vector<PhysicalHandle>& out);
  // True when a range set aside after a failed unmap lies inside the hole.
  bool overlaps_lost_range(const Block& hole) const noexcept;
  // Unmaps the pages [first, last) of free mapped block `block` (page-aligned, inside it) and
  // appends their handles to out; false (and nothing changed) if the device refused.
  bool unmap_pages_locked(Block* block, std::uintptr_t first, std::uintptr_t last,
                          std::vector<PhysicalHandle>& out);
  void release_pages_locked(std::vector<PhysicalHandle>& handles);
  bool release_paged_locked();
  void snapshot_paged_segment(const Segment& segment, AllocatorSnapshot& out) const;
  void release_segment_locked(Segment& segment);
  // Returns every wholly free segment to the device; true if any was released.
  bool release_cached_locked();
  // Returns the wholly free segment-path segments that `which` picks; true if any went back.
  // A segment the device refuses stays, logged.
  bool release_free_segments_locked(const std::function<bool(const Segment&)>& which);
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
  const bool paged_;        // Note [Paged pool]
  const std::size_t page_;  // the device's granularity on the paged path
  FreeBlockIndex pools_[2];                 // small, large
  FreeBlockIndex holes_[2];                 // paged path: unmapped free blocks, small, large
  std::vector<Stream> paged_streams_;       // streams with a paged segment
  std::size_t active_high_water_ = 0;       // most active bytes ever (not reset with the stats)
  std::size_t moved_pages_ = 0;             // pages stitching moved since the high water last rose
  std::size_t learned_headroom_ = 0;        // reserve allowed beyond the configured headroom
  std::size_t released_bytes_ = 0;          // segment path: returned since the high water rose
  // Learned placement (Note [Learned placement]).
  const bool learned_placement_;
  StepLearner learner_;
  bool learned_stream_known_ = false;
  Stream learned_stream_;                   // the one stream the learner follows
  Segment* arena_segment_ = nullptr;        // the plan's arena, while a plan is in force
  FreeBlockIndex plan_arena_{FreeBlockIndex::Order::kAddress};  // its free blocks, by address
  std::size_t planned_allocations_ = 0;
  struct TakenPlan {
    std::size_t arena_bytes = 0;
    std::size_t live_bytes = 0;  // its allocations' most bytes live at once
  };
  TakenPlan taken_plan_;  // the plan the learner is following (its arena may not be open yet)
  // Mapped ranges that neither unmap nor become accessible after a failed map (address, bytes):
  // kept out of use, unmapped again by every release until that works.
  std::vector<std::pair<std::uintptr_t, std::size_t>> lost_ranges_;
  BlockMap allocated_;                      // allocated blocks by address
  std::map<std::uintptr_t, Segment> segments_;  // by base address
  std::vector<PendingEvent> pending_events_;
  std::map<PoolId, std::unique_ptr<PrivatePool>> private_pools_;
  std::vector<std::pair<PrivatePool*, StreamFilter>> captures_;  // pools being allocated to
  std::vector<Block*> deferred_frees_;
  std::vector<TraceListener> trace_listeners_;  // pending blocks whose events wait for captures to end
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
