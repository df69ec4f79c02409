#include "allocator/caching_allocator.hpp"

#include <algorithm>
#include <cmath>

#include "allocator/base/byte_units.hpp"
#include "allocator/base/errors.hpp"
#include "allocator/base/log.hpp"

namespace stowage {

namespace {

std::int64_t as_signed(std::size_t bytes) { return static_cast<std::int64_t>(bytes); }

bool use_paged_pool(const DeviceBackend& backend, const AllocatorConfig& config) {
  const bool available =
      backend.properties().virtual_memory && backend.properties().granularity > 0;
  switch (config.virtual_memory) {
    case VirtualMemoryMode::kOff:
      return false;
    case VirtualMemoryMode::kOn:
      STOWAGE_CHECK(available, "virtual_memory:on, but ", backend.properties().name,
                    " has no virtual memory management; use virtual_memory:auto or off");
      return true;
    case VirtualMemoryMode::kAuto:
      break;
  }
  return available;
}

}  // namespace

CachingAllocator::CachingAllocator(DeviceBackend& backend, AllocatorConfig config)
    : backend_(backend),
      config_(config),
      paged_(use_paged_pool(backend, config)),
      page_(paged_ ? backend.properties().granularity : 0),
      learned_placement_(paged_ && config.placement == PlacementMode::kLearned),
      limit_bytes_(config.limit_bytes),
      memory_fraction_(config.memory_fraction) {
  STOWAGE_CHECK(config.memory_fraction > 0 && config.memory_fraction <= 1,
                "memory_fraction must be in (0, 1], not ", config.memory_fraction);
  STOWAGE_CHECK(config.reserve_headroom >= 0 && config.reserve_headroom <= 1,
                "reserve_headroom must be in [0, 1], not ", config.reserve_headroom);
  STOWAGE_CHECK(config.limit_bytes > 0, "the memory limit must be positive");
  stats_.max_split_size =
      config.max_split_size == AllocatorConfig::kUnlimited ? -1 : as_signed(config.max_split_size);
  if (config.placement == PlacementMode::kLearned && !paged_) {
    log_warning(detail::concat("placement:learned needs virtual memory, which ",
                               backend.properties().name,
                               " does not offer; allocations are placed dynamically"));
  }
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  try {
    synchronize_pending_locked();
    release_cached_locked();
    release_private_segments_locked(/*all=*/true);
  } catch (const std::exception& error) {
    log_warning(detail::concat("releasing cached memory at shutdown failed: ", error.what()));
  }
  if (allocated_.size() > 0) {
    log_warning(detail::concat(allocated_.size(), " block(s), ",
                               format_bytes(static_cast<std::size_t>(
                                   stats_.allocated_bytes.all().current)),
                               ", were still allocated when the allocator was destroyed; their "
                               "segments are left to the device"));
  }
  for (const Event event : spare_events_) {
    try {
      backend_.destroy_event(event);
    } catch (...) {
      // The device is going away; nothing more to do.
    }
  }
}

// --- malloc ---

void* CachingAllocator::malloc(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  const std::uint64_t context = context_for_history();
  const bool representable = bytes <= SizePolicy::kMaxRequest;
  const std::size_t rounded = representable ? SizePolicy::block_size(bytes) : bytes;
  if (representable) {
    {
      std::lock_guard lock(mutex_);
      if (Block* block = try_malloc_locked(bytes, rounded, stream, context)) return block->pointer();
    }
    // Costly relief, without the lock: handlers free blocks through free().
    std::vector<MemoryPressureHandler*> handlers;
    {
      std::lock_guard lock(mutex_);
      handlers = pressure_handlers_;
    }
    for (MemoryPressureHandler* handler : handlers) {
      if (handler->relieve_pressure(rounded, stream) == 0) continue;
      std::lock_guard lock(mutex_);
      if (Block* block = try_malloc_locked(bytes, rounded, stream, context)) return block->pointer();
    }
  }
  OomReport report;
  std::vector<OomObserver> observers;
  {
    std::lock_guard lock(mutex_);
    report = oom_report_locked(bytes, rounded, stream);
    ++stats_.num_ooms;
    record_locked(TraceAction::kOom, report.device_free, bytes, stream, context);
    for (const auto& [id, observer] : oom_observers_) observers.push_back(observer);
  }
  for (const OomObserver& observer : observers) {
    try {
      observer(report);
    } catch (const std::exception& error) {
      log_warning(detail::concat("an out-of-memory observer threw: ", error.what()));
    }
  }
  throw OutOfMemory(report.message, __FILE__, __LINE__);
}

Block* CachingAllocator::try_malloc_locked(std::size_t bytes, std::size_t rounded, Stream stream,
                                           std::uint64_t context) {
  if (!capturing()) {
    flush_deferred_frees_locked();
    process_events_locked();
  }
  const Pool pool = SizePolicy::pool_for(rounded);
  const bool oversize = rounded >= config_.max_split_size;
  if (PrivatePool* owner = capturing() ? capture_pool_locked(stream) : nullptr) {
    // Note [Private pools]: the pool's own blocks, else a segment of its own.
    Block* block = find_cached_locked(pool, stream, rounded, oversize, owner);
    if (block == nullptr) block = allocate_segment_locked(pool, stream, rounded, context, owner);
    if (block == nullptr) return nullptr;
    return claim_locked(block, bytes, rounded, oversize, /*fresh=*/false, context);
  }
  // A block the paged path has just formed from new pages may be split even for an oversize
  // request: its remainder is the partial page at its end, not part of a huge cached block.
  bool fresh = false;
  auto grow = [&] {
    fresh = paged_;
    return paged_ ? grow_paged_locked(pool, stream, rounded, context)
                  : allocate_segment_locked(pool, stream, rounded, context);
  };
  // Note [Learned placement]: the plan's address for this request, when a plan is in force.
  const bool learning = learned_placement_ && pool == Pool::kLarge && !capturing();
  bool commit_when_served = false;
  if (learning) {
    if (Block* placed = place_planned_locked(rounded, stream, context, commit_when_served)) {
      return claim_locked(placed, bytes, rounded, oversize, /*fresh=*/false, context);
    }
  }
  // The segment path spares wholly free segments much larger than the request while the device
  // can give a new one (Note [Splitting]); failing that, it carves them after all.
  const bool spare = !paged_ && config_.reserve_headroom < 1;
  Block* block = find_cached_locked(pool, stream, rounded, oversize, nullptr, spare);
  if (block == nullptr) block = grow();
  if (block == nullptr && spare) block = find_cached_locked(pool, stream, rounded, oversize);
  if (block == nullptr && arena_segment_ != nullptr && !capturing()) {
    // The plan's arena holds free memory the dynamic path cannot reach: give the plan up rather
    // than fail (Note [Learned placement]).
    learner_.depart();
    dissolve_arena_locked();
    commit_when_served = false;
    fresh = false;
    block = find_cached_locked(pool, stream, rounded, oversize);
    if (block == nullptr) block = grow();
  }
  // (Under capture there is no waiting for pending frees nor giving memory back.)
  if (block == nullptr && !capturing()) {
    // Note [Miss path]: wait for pending frees (they may complete a fitting block), then give
    // wholly free segments back to the device and ask it again.
    ++stats_.num_alloc_retries;
    synchronize_pending_locked();
    fresh = false;
    block = find_cached_locked(pool, stream, rounded, oversize);
    if (block == nullptr && paged_) {
      // Pages under blocks that just completed can be moved; releasing the cache would only
      // give back what stitching can use.
      block = grow();
    } else if (block == nullptr) {
      release_cached_locked();
      // Asked again even when nothing was released: the device's failure may have been
      // transient, and memory freed elsewhere on the device may have come back.
      block = allocate_segment_locked(pool, stream, rounded, context);
    }
  }
  if (block == nullptr && !capturing()) {
    // Last, the free blocks of private pools that lend theirs rather than see an OOM (torch's
    // MemPool(use_on_oom=True)); the block stays the pool's and returns to it when freed.
    for (auto& [id, lender] : private_pools_) {
      if (!lender->use_on_oom) continue;
      block = find_cached_locked(pool, stream, rounded, oversize, lender.get());
      if (block != nullptr) break;
    }
    fresh = false;
  }
  if (block == nullptr) return nullptr;
  Block* claimed = claim_locked(block, bytes, rounded, oversize, fresh, context);
  if (commit_when_served && learner_.phase() == StepLearner::Phase::kPlaced) {
    learner_.commit_planned();
  }
  if (learning) learn_malloc_locked(claimed, rounded, stream);
  return claimed;
}

Block* CachingAllocator::find_cached_locked(Pool pool, Stream stream, std::size_t rounded,
                                            bool oversize, PrivatePool* owner,
                                            bool spare_whole_segments) {
  FreeBlockIndex& index = index_of(pool, owner);
  Block* block = index.best_fit(stream, rounded);
  if (block == nullptr) return nullptr;
  if (spare_whole_segments && !block->is_split() &&
      SizePolicy::spares_whole_segment(block->size, rounded)) {
    return nullptr;
  }
  // Oversize blocks serve oversize requests only, and only when they waste at most one
  // medium segment's worth: carving them up is what strands huge holes.
  // (A block no bigger than the segment this request would get is fair game, oversize or not.)
  if (!oversize && block->size >= config_.max_split_size &&
      block->size > SizePolicy::segment_size(rounded)) {
    return nullptr;
  }
  if (oversize && block->size - rounded >= SizePolicy::kMediumSegmentSize) return nullptr;
  count_inactive_split_locked(*block, -1);
  index.erase(*block);
  return block;
}

Block* CachingAllocator::allocate_segment_locked(Pool pool, Stream stream, std::size_t rounded,
                                                 std::uint64_t context, PrivatePool* owner) {
  // The preferred size first (a medium request's shared 20 MiB segment); when the device or
  // the limit refuses it, the smallest segment that holds the block.
  const std::size_t preferred = SizePolicy::segment_size(rounded);
  const std::size_t smallest = SizePolicy::smallest_segment_size(rounded);
  if (owner == nullptr && !capturing()) release_beyond_headroom_locked(preferred, rounded);
  auto try_size = [&](std::size_t size) -> void* {
    const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
    if (size > limit_locked() || reserved > limit_locked() - size) return nullptr;
    return backend_.try_allocate_segment(size);
  };
  std::size_t size = preferred;
  void* base = try_size(size);
  if (base == nullptr && smallest < preferred) base = try_size(size = smallest);
  if (base == nullptr) return nullptr;
  const auto address = reinterpret_cast<std::uintptr_t>(base);
  Block* block = nullptr;
  try {
    block = add_segment_locked(address, size, stream, pool, context, /*paged=*/false);
  } catch (...) {
    backend_.free_segment(base);
    throw;
  }
  block->segment->owner = owner;
  if (owner != nullptr) ++owner->segments;
  ++stats_.num_device_alloc;
  stats_.segment.update(pool, 1);
  stats_.reserved_bytes.update(pool, as_signed(size));
  if (size >= config_.max_split_size) stats_.oversize_segments.update(1);
  record_locked(TraceAction::kSegmentAlloc, address, size, stream, context);
  return block;
}

void CachingAllocator::release_beyond_headroom_locked(std::size_t size, std::size_t rounded) {
  if (config_.reserve_headroom >= 1) return;  // grow whenever the device has room
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
  const double in_use = static_cast<double>(std::max(
      active_high_water_, static_cast<std::size_t>(stats_.active_bytes.all().current) + rounded));
  if (static_cast<double>(reserved + size) <=
      (1.0 + config_.reserve_headroom) * in_use + static_cast<double>(learned_headroom_)) {
    return;
  }
  // Note [Segment headroom]: cached segments no request has fitted go back before a new one
  // comes, so reserved stays near the peak in use.
  synchronize_pending_locked();
  release_free_segments_locked([](const Segment& segment) { return segment.owner == nullptr; });
  const auto released =
      reserved - static_cast<std::size_t>(stats_.reserved_bytes.all().current);
  released_bytes_ += released;
  // A loop that keeps returning and asking again churns: allow it 1% more reserve each time it
  // has returned an eighth of its peak, until its layout fits.
  if (8 * released_bytes_ >= active_high_water_ && released > 0) {
    learned_headroom_ += std::max(SizePolicy::kMediumSegmentSize, active_high_water_ / 100);
    released_bytes_ = 0;
  }
}

Block* CachingAllocator::add_segment_locked(std::uintptr_t base, std::size_t size, Stream stream,
                                            Pool pool, std::uint64_t context, bool paged) {
  Segment& segment = segments_[base];
  segment.base = base;
  segment.size = size;
  segment.stream = stream;
  segment.pool = pool;
  segment.context = context;
  segment.paged = paged;
  Block* block = nullptr;
  try {
    block = arena_.acquire();
  } catch (...) {
    segments_.erase(base);
    throw;
  }
  block->address = base;
  block->size = size;
  block->stream = stream;
  block->segment = &segment;
  block->mapped = !paged;
  segment.first = block;
  return block;
}

void CachingAllocator::split_after_locked(Block* block, std::size_t keep, Block* rest) noexcept {
  rest->address = block->address + keep;
  rest->size = block->size - keep;
  rest->stream = block->stream;
  rest->segment = block->segment;
  rest->mapped = block->mapped;
  rest->prev = block;
  rest->next = block->next;
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = keep;
}

Block* CachingAllocator::claim_locked(Block* block, std::size_t bytes, std::size_t rounded,
                                      bool oversize, bool fresh, std::uint64_t context) {
  const Pool pool = block->segment->pool;
  const std::size_t remainder = block->size - rounded;
  Block* rest = nullptr;
  const bool whole = block->segment->owner != nullptr && block->segment->owner->no_split;
  if (!whole && SizePolicy::should_split(pool, remainder, oversize && !fresh, block->segment->paged)) {
    try {
      rest = arena_.acquire();
    } catch (const std::bad_alloc&) {
      rest = nullptr;  // no memory for bookkeeping: hand out the whole block unsplit
    }
  }
  if (rest != nullptr) {
    split_after_locked(block, rounded, rest);
    index_for(*rest).insert(*rest);
    count_inactive_split_locked(*rest, 1);
  }
  mark_allocated_locked(block, bytes, oversize, context);
  return block;
}

void CachingAllocator::mark_allocated_locked(Block* block, std::size_t bytes, bool oversize,
                                             std::uint64_t context) {
  const Pool pool = block->segment->pool;
  block->state = BlockState::kAllocated;
  block->requested = bytes;
  block->oversize = oversize;
  block->context = context;
  allocated_.insert(*block);
  stats_.allocation.update(pool, 1);
  stats_.allocated_bytes.update(pool, as_signed(block->size));
  stats_.requested_bytes.update(pool, as_signed(bytes));
  stats_.active.update(pool, 1);
  stats_.active_bytes.update(pool, as_signed(block->size));
  if (const auto active = static_cast<std::size_t>(stats_.active_bytes.all().current);
      active > active_high_water_) {
    active_high_water_ = active;
    moved_pages_ = 0;
    released_bytes_ = 0;
  }
  if (oversize) stats_.oversize_allocations.update(1);
  record_locked(TraceAction::kAlloc, block->address, bytes, block->stream, context);
}

// --- free ---

void CachingAllocator::free(void* ptr) noexcept { free_checked(ptr, std::nullopt); }

void CachingAllocator::free(void* ptr, std::size_t requested_bytes) noexcept {
  free_checked(ptr, requested_bytes);
}

void CachingAllocator::free_checked(void* ptr,
                                    std::optional<std::size_t> requested_bytes) noexcept {
  if (ptr == nullptr) return;
  const std::uint64_t context = context_for_history();
  std::unique_lock lock(mutex_);
  Block* block = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (block == nullptr) {
    ++stats_.num_invalid_frees;
    lock.unlock();
    log_warning(detail::concat("free of ", ptr,
                               ", which this allocator did not allocate or has already freed; "
                               "ignored"));
    return;
  }
  if (requested_bytes.has_value() && *requested_bytes != block->requested) {
    ++stats_.num_invalid_frees;
    const std::size_t allocated = block->requested;
    lock.unlock();
    log_warning(detail::concat("free of ", ptr, " as ", *requested_bytes,
                               " bytes, but it was allocated as ", allocated,
                               " bytes; the allocation is kept (not freed)"));
    return;
  }
  end_allocation_locked(block, context);
  if (!block->stream_uses.empty() && capturing()) {
    // Events recorded now would join the capture: they are recorded when it ends.
    block->state = BlockState::kPendingFree;
    deferred_frees_.push_back(block);
    return;
  }
  await_stream_uses_locked(block);
}

void CachingAllocator::end_allocation_locked(Block* block, std::uint64_t context) {
  allocated_.erase(*block);
  if (block->learned_record != StepLearner::kNoRecord) {
    learner_.record_free(block->learned_record);
    block->learned_record = StepLearner::kNoRecord;
  }
  const Pool pool = block->segment->pool;
  stats_.allocation.update(pool, -1);
  stats_.allocated_bytes.update(pool, -as_signed(block->size));
  stats_.requested_bytes.update(pool, -as_signed(block->requested));
  if (block->oversize) stats_.oversize_allocations.update(-1);
  record_locked(TraceAction::kFreeRequested, block->address, block->requested, block->stream,
                context);
}

void CachingAllocator::await_stream_uses_locked(Block* block) {
  if (block->stream_uses.empty()) {
    free_block_locked(block);
    return;
  }
  // Note [Stream-ordered reuse]: other streams may still use the block; it becomes free when
  // events recorded on each of them now have completed.
  block->state = BlockState::kPendingFree;
  try {
    for (const Stream use : block->stream_uses) {
      const Event event = acquire_event_locked();
      pending_events_.push_back({event, block});
      ++block->pending_events;
      backend_.record_event(event, use);
    }
  } catch (const std::exception& error) {
    // Without events, wait for the streams themselves: slower, but reuse stays safe.
    bool synchronized = true;
    try {
      for (const Stream use : block->stream_uses) backend_.synchronize_stream(use);
    } catch (const std::exception& second) {
      log_warning(detail::concat("block ", block->pointer(), " cannot be reused: recording an event failed (",
                                 error.what(), ") and so did waiting for its streams (",
                                 second.what(), ")"));
      synchronized = false;
    }
    std::erase_if(pending_events_, [&](const PendingEvent& pending) {
      if (pending.block != block) return false;
      spare_events_.push_back(pending.event);
      return true;
    });
    block->pending_events = 0;
    // Unless the streams were waited for, the block stays pending for good: it is never handed
    // out again while a stream might still use it.
    if (synchronized) free_block_locked(block);
  }
}

void CachingAllocator::free_block_locked(Block* block) {
  const Pool pool = block->segment->pool;
  stats_.active.update(pool, -1);
  stats_.active_bytes.update(pool, -as_signed(block->size));
  record_locked(TraceAction::kFreeCompleted, block->address, block->requested, block->stream,
                block->context);
  block->state = BlockState::kFree;
  block->requested = 0;
  block->oversize = false;
  block->context = 0;
  block->stream_uses.clear();
  Block* freed = insert_free_locked(block);
  // A segment of a private pool nobody holds goes back as soon as it is wholly free.
  if (const PrivatePool* owner = freed->segment->owner;
      owner != nullptr && owner->use_count == 0 && freed->segment->is_free() && !capturing()) {
    release_private_segments_locked(/*all=*/false);
  }
}

Block* CachingAllocator::insert_free_locked(Block* block) {
  auto mergeable = [&](const Block* neighbour) {
    return neighbour != nullptr && neighbour->state == BlockState::kFree &&
           neighbour->mapped == block->mapped;
  };
  if (Block* prev = block->prev; mergeable(prev)) {
    count_inactive_split_locked(*prev, -1);
    index_for(*prev).erase(*prev);
    block->address = prev->address;
    block->size += prev->size;
    block->prev = prev->prev;
    if (block->prev != nullptr) {
      block->prev->next = block;
    } else {
      block->segment->first = block;
    }
    arena_.recycle(prev);
  }
  if (Block* next = block->next; mergeable(next)) {
    count_inactive_split_locked(*next, -1);
    index_for(*next).erase(*next);
    block->size += next->size;
    block->next = next->next;
    if (block->next != nullptr) block->next->prev = block;
    arena_.recycle(next);
  }
  index_for(*block).insert(*block);
  count_inactive_split_locked(*block, 1);
  return block;
}

void CachingAllocator::record_stream(void* ptr, Stream stream) {
  std::lock_guard lock(mutex_);
  Block* block = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
  STOWAGE_CHECK(block != nullptr, "record_stream of ", ptr,
                ", which is not a live allocation of this allocator");
  if (stream == block->stream) return;
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) ==
      block->stream_uses.end()) {
    block->stream_uses.push_back(stream);
  }
}

// --- events ---

Event CachingAllocator::acquire_event_locked() {
  if (!spare_events_.empty()) {
    const Event event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  return backend_.create_event();
}

void CachingAllocator::process_events_locked() {
  if (pending_events_.empty()) return;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < pending_events_.size(); ++i) {
    const PendingEvent pending = pending_events_[i];
    bool done = false;
    try {
      done = backend_.query_event(pending.event);
    } catch (const std::exception& error) {
      log_warning(detail::concat("querying an event failed: ", error.what()));
    }
    if (!done) {
      pending_events_[kept++] = pending;
      continue;
    }
    spare_events_.push_back(pending.event);
    if (--pending.block->pending_events == 0) free_block_locked(pending.block);
  }
  pending_events_.resize(kept);
}

void CachingAllocator::synchronize_pending_locked() {
  if (pending_events_.empty()) return;
  ++stats_.num_sync_all_streams;
  for (const PendingEvent& pending : pending_events_) backend_.synchronize_event(pending.event);
  process_events_locked();
}

// --- releasing memory ---

void CachingAllocator::release_segment_locked(Segment& segment) {
  backend_.free_segment(reinterpret_cast<void*>(segment.base));
  if (segment.owner != nullptr) --segment.owner->segments;
  ++stats_.num_device_free;
  stats_.segment.update(segment.pool, -1);
  stats_.reserved_bytes.update(segment.pool, -as_signed(segment.size));
  if (segment.size >= config_.max_split_size) stats_.oversize_segments.update(-1);
  record_locked(TraceAction::kSegmentFree, segment.base, segment.size, segment.stream, 0);
}

bool CachingAllocator::release_cached_locked() {
  // The plan's arena goes back like any cache; learning starts again.
  if (learner_.phase() == StepLearner::Phase::kPlaced) {
    dissolve_arena_locked();
    learner_.reset();
  }
  const bool released = release_private_segments_locked(/*all=*/false);
  if (paged_) return release_paged_locked() || released;
  return release_free_segments_locked(
             [](const Segment& segment) { return segment.owner == nullptr; }) ||
         released;
}

bool CachingAllocator::release_free_segments_locked(
    const std::function<bool(const Segment&)>& which) {
  bool released = false;
  for (auto it = segments_.begin(); it != segments_.end();) {
    Segment& segment = it->second;
    if (segment.paged || !segment.is_free() || !which(segment)) {
      ++it;
      continue;
    }
    Block* block = segment.first;
    index_for(*block).erase(*block);
    try {
      release_segment_locked(segment);
    } catch (const std::exception& error) {
      index_for(*block).insert(*block);
      log_warning(detail::concat("returning a segment to the device failed: ", error.what()));
      ++it;
      continue;
    }
    arena_.recycle(block);
    it = segments_.erase(it);
    released = true;
  }
  return released;
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  STOWAGE_CHECK(!capturing(), "empty_cache during a CUDA graph capture: giving memory back "
                "needs a device synchronisation, which would break the capture; call it "
                "before or after capturing");
  flush_deferred_frees_locked();
  synchronize_pending_locked();
  release_cached_locked();
}

// --- limits ---

void CachingAllocator::set_memory_fraction(double fraction) {
  STOWAGE_CHECK(fraction >= 0 && fraction <= 1, "memory fraction must be in [0, 1], not ",
                fraction);
  std::lock_guard lock(mutex_);
  memory_fraction_ = fraction;
}

void CachingAllocator::set_limit(std::size_t bytes) {
  STOWAGE_CHECK(bytes > 0, "the memory limit must be positive");
  std::lock_guard lock(mutex_);
  limit_bytes_ = bytes;
}

std::size_t CachingAllocator::limit_locked() const {
  const std::size_t total = backend_.properties().total_bytes;
  const auto by_fraction =
      static_cast<std::size_t>(std::floor(memory_fraction_ * static_cast<double>(total)));
  return std::min({total, by_fraction, limit_bytes_});
}

std::size_t CachingAllocator::limit() const {
  std::lock_guard lock(mutex_);
  return limit_locked();
}

double CachingAllocator::memory_fraction() const {
  std::lock_guard lock(mutex_);
  return memory_fraction_;
}

// --- stats, history, snapshot ---

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
}

void CachingAllocator::record_history(bool enabled, std::size_t max_entries) {
  std::lock_guard lock(mutex_);
  if (enabled) {
    history_.enable(max_entries);
  } else {
    history_.disable();
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

void CachingAllocator::record_locked(TraceAction action, std::uintptr_t address, std::size_t size,
                                     Stream stream, std::uint64_t context) {
  if (!history_.enabled() && trace_listeners_.empty()) return;
  const TraceEntry entry{action, address, size, stream, History::now_us(), context};
  for (const TraceListener& listener : trace_listeners_) {
    try {
      listener(entry);
    } catch (const std::exception& error) {
      log_warning(detail::concat("a trace listener threw: ", error.what()));
    }
  }
  if (history_.enabled()) history_.record(entry);
}

void CachingAllocator::add_trace_listener(TraceListener listener) {
  STOWAGE_CHECK(static_cast<bool>(listener), "add_trace_listener needs a function");
  std::lock_guard lock(mutex_);
  trace_listeners_.push_back(std::move(listener));
}

AllocatorSnapshot CachingAllocator::snapshot() const {
  std::lock_guard lock(mutex_);
  AllocatorSnapshot out;
  out.device = backend_.properties().device_index;
  out.segments.reserve(segments_.size());
  for (const auto& [base, segment] : segments_) {
    if (segment.paged) {
      snapshot_paged_segment(segment, out);
      continue;
    }
    SegmentSnapshot& shot = out.segments.emplace_back();
    shot.address = segment.base;
    shot.total_size = segment.size;
    shot.stream = segment.stream;
    shot.pool = segment.pool;
    shot.context = segment.context;
    if (segment.owner != nullptr) shot.owner = segment.owner->id;
    for (const Block* block = segment.first; block != nullptr; block = block->next) {
      shot.blocks.push_back(
          {block->address, block->size, block->requested, block->state, block->context});
      if (block->state != BlockState::kFree) shot.active_size += block->size;
      if (block->state == BlockState::kAllocated) {
        shot.allocated_size += block->size;
        shot.requested_size += block->requested;
      }
    }
  }
  out.trace = history_.entries();
  return out;
}

std::size_t CachingAllocator::block_size(const void* ptr) const {
  std::lock_guard lock(mutex_);
  const Block* block = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
  return block == nullptr ? 0 : block->size;
}

// --- handlers and observers ---

void CachingAllocator::add_pressure_handler(MemoryPressureHandler* handler) {
  STOWAGE_CHECK(handler != nullptr, "add_pressure_handler needs a handler");
  std::lock_guard lock(mutex_);
  pressure_handlers_.push_back(handler);
}

void CachingAllocator::remove_pressure_handler(MemoryPressureHandler* handler) {
  std::lock_guard lock(mutex_);
  std::erase(pressure_handlers_, handler);
}

std::size_t CachingAllocator::add_oom_observer(OomObserver observer) {
  STOWAGE_CHECK(static_cast<bool>(observer), "add_oom_observer needs a function");
  std::lock_guard lock(mutex_);
  const std::size_t id = next_observer_id_++;
  oom_observers_.emplace(id, std::move(observer));
  return id;
}

void CachingAllocator::remove_oom_observer(std::size_t id) {
  std::lock_guard lock(mutex_);
  oom_observers_.erase(id);
}

// --- OOM ---

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
  for (const FreeBlockIndex& index : pools_) {
    index.for_each([&](const Block& block) {
      report.largest_free_block = std::max(report.largest_free_block, block.size);
    });
  }
  report.device_total = backend_.properties().total_bytes;
  try {
    report.device_free = backend_.memory_info().free_bytes;
  } catch (const std::exception&) {
    report.device_free = 0;
  }
  report.limit = limit_locked();
  report.describe();
  return report;
}

// --- invariants ---

void CachingAllocator::count_inactive_split_locked(const Block& block, int sign) {
  if (!block.is_split() || !block.mapped) return;
  const Pool pool = block.segment->pool;
  stats_.inactive_split.update(pool, sign);
  stats_.inactive_split_bytes.update(pool, sign * as_signed(block.size));
}

void CachingAllocator::check_invariants() const {
  std::lock_guard lock(mutex_);
  struct Sums {
    std::int64_t reserved = 0, allocated = 0, pending = 0, free = 0, requested = 0;
    std::int64_t segments = 0, allocations = 0, active = 0, inactive_split = 0;
    std::int64_t inactive_split_bytes = 0;
  };
  Sums sums[2];
  std::size_t free_blocks = 0;
  std::size_t allocated_blocks = 0;
  std::size_t blocks = 0;
  for (const auto& [base, segment] : segments_) {
    Sums& sum = sums[segment.pool == Pool::kSmall ? 0 : 1];
    STOWAGE_INTERNAL_ASSERT(base == segment.base && segment.first != nullptr);
    STOWAGE_INTERNAL_ASSERT(segment.first->prev == nullptr && segment.first->address == base,
                            "segment ", base, " does not start with its first block");
    sum.reserved += as_signed(segment.paged ? segment.mapped_pages * page_ : segment.size);
    ++sum.segments;
    STOWAGE_INTERNAL_ASSERT(segment.paged == (paged_ && segment.owner == nullptr), "segment ",
                            base, " is of the wrong path");
    if (segment.paged) {
      STOWAGE_INTERNAL_ASSERT(segment.size % page_ == 0 &&
                              segment.pages.size() <= segment.size / page_);
      STOWAGE_INTERNAL_ASSERT(
          static_cast<std::size_t>(std::count_if(segment.pages.begin(), segment.pages.end(),
                                                 [](std::uint64_t h) { return h != 0; })) ==
              segment.mapped_pages,
          "segment ", base, " counts ", segment.mapped_pages, " mapped pages wrongly");
    }
    std::size_t pages_under_blocks = 0;
    std::size_t last_counted_page = SIZE_MAX;
    std::uintptr_t expected = base;
    const Block* prev = nullptr;
    for (const Block* block = segment.first; block != nullptr; block = block->next) {
      if (segment.paged) {
        // Holes are page-aligned and unmapped; every other block lies on mapped pages. Counting
        // the distinct pages under mapped blocks against mapped_pages proves holes unmapped.
        const std::size_t first = (block->address - base) / page_;
        const std::size_t last = (block->address + block->size - base - 1) / page_;
        if (!block->mapped) {
          STOWAGE_INTERNAL_ASSERT(block->state == BlockState::kFree &&
                                      (block->address - base) % page_ == 0 &&
                                      block->size % page_ == 0,
                                  "hole ", block->address, " is not free whole pages");
        } else {
          for (std::size_t page = first; page <= last; ++page) {
            STOWAGE_INTERNAL_ASSERT(page < segment.pages.size() && segment.pages[page] != 0,
                                    "block ", block->address,
                                    " lies on unmapped page ", page, " of segment ", base);
            if (page != last_counted_page) ++pages_under_blocks;
            last_counted_page = page;
          }
        }
      } else {
        STOWAGE_INTERNAL_ASSERT(block->mapped, "an unmapped block in segment ", base);
      }
      ++blocks;
      STOWAGE_INTERNAL_ASSERT(block->segment == &segment && block->prev == prev,
                              "broken block list in segment ", base);
      STOWAGE_INTERNAL_ASSERT(block->address == expected, "gap or overlap at ", block->address,
                              " in segment ", base, " (expected ", expected, ")");
      STOWAGE_INTERNAL_ASSERT(block->size > 0 && block->size % SizePolicy::kMinBlockSize == 0);
      STOWAGE_INTERNAL_ASSERT(block->stream == segment.stream);
      switch (block->state) {
        case BlockState::kFree:
          STOWAGE_INTERNAL_ASSERT(
              prev == nullptr || prev->state != BlockState::kFree || prev->mapped != block->mapped,
              "free neighbours not coalesced at ", block->address);
          ++free_blocks;
          if (!block->mapped) break;
          sum.free += as_signed(block->size);
          if (block->is_split()) {
            ++sum.inactive_split;
            sum.inactive_split_bytes += as_signed(block->size);
          }
          break;
        case BlockState::kAllocated:
          STOWAGE_INTERNAL_ASSERT(allocated_.find(block->address) == block,
                                  "allocated block ", block->address, " missing from the map");
          sum.allocated += as_signed(block->size);
          sum.requested += as_signed(block->requested);
          ++sum.allocations;
          ++sum.active;
          ++allocated_blocks;
          break;
        case BlockState::kPendingFree:
          sum.pending += as_signed(block->size);
          ++sum.active;
          break;
      }
      expected += block->size;
      prev = block;
    }
    STOWAGE_INTERNAL_ASSERT(expected == base + segment.size, "blocks of segment ", base,
                            " do not reach its end");
    if (segment.paged) {
      STOWAGE_INTERNAL_ASSERT(pages_under_blocks == segment.mapped_pages, "segment ", base, " has ",
                              segment.mapped_pages, " mapped pages but blocks lie on ",
                              pages_under_blocks);
    }
  }
  STOWAGE_INTERNAL_ASSERT(blocks == arena_.live(), "the arena holds ", arena_.live(),
                          " blocks but segments hold ", blocks);
  STOWAGE_INTERNAL_ASSERT(allocated_blocks == allocated_.size(), "the address map holds ",
                          allocated_.size(), " blocks but ", allocated_blocks, " are allocated");
  std::size_t indexed = pools_[0].size() + pools_[1].size() + holes_[0].size() +
                        holes_[1].size() + plan_arena_.size();
  STOWAGE_INTERNAL_ASSERT(arena_segment_ == nullptr || arena_segment_->planned,
                          "the plan's arena is not marked planned");
  for (const auto& [base, segment] : segments_) {
    STOWAGE_INTERNAL_ASSERT(!segment.planned || &segment == arena_segment_,
                            "segment ", base, " is planned but not the plan's arena");
  }
  plan_arena_.for_each([&](const Block& block) {
    STOWAGE_INTERNAL_ASSERT(block.state == BlockState::kFree && block.segment == arena_segment_,
                            "the arena's index holds a block it should not");
  });
  for (const auto& [id, pool] : private_pools_) {
    indexed += pool->free[0].size() + pool->free[1].size();
    std::size_t owned = 0;
    for (const auto& [base, segment] : segments_) if (segment.owner == pool.get()) ++owned;
    STOWAGE_INTERNAL_ASSERT(owned == pool->segments, "private pool (", id.first, ", ", id.second,
                            ") counts ", pool->segments, " segments but owns ", owned);
    for (int p = 0; p < 2; ++p) {
      pool->free[p].for_each([&](const Block& block) {
        STOWAGE_INTERNAL_ASSERT(block.state == BlockState::kFree && block.mapped &&
                                    block.segment->owner == pool.get(),
                                "a private pool's free list holds a block it should not");
      });
    }
  }
  STOWAGE_INTERNAL_ASSERT(free_blocks == indexed, "the free indexes hold ", indexed,
                          " blocks but ", free_blocks, " are free");
  for (int p = 0; p < 2; ++p) {
    const Pool pool = p == 0 ? Pool::kSmall : Pool::kLarge;
    pools_[p].for_each([&](const Block& block) {
      STOWAGE_INTERNAL_ASSERT(block.state == BlockState::kFree && block.mapped &&
                                  block.segment->pool == pool && block.segment->owner == nullptr &&
                                  !block.segment->planned,
                              "the free index of a pool holds a block it should not");
    });
    holes_[p].for_each([&](const Block& block) {
      STOWAGE_INTERNAL_ASSERT(block.state == BlockState::kFree && !block.mapped &&
                                  block.segment->pool == pool && !block.segment->planned,
                              "the hole index of a pool holds a block it should not");
    });
    const Sums& sum = sums[p];
    // The accounting identity: reserved == allocated + pending + free.
    STOWAGE_INTERNAL_ASSERT(sum.reserved == sum.allocated + sum.pending + sum.free);
    STOWAGE_INTERNAL_ASSERT(stats_.reserved_bytes.of(pool).current == sum.reserved,
                            "reserved_bytes ", stats_.reserved_bytes.of(pool).current, " != ",
                            sum.reserved);
    STOWAGE_INTERNAL_ASSERT(stats_.allocated_bytes.of(pool).current == sum.allocated,
                            "allocated_bytes ", stats_.allocated_bytes.of(pool).current, " != ",
                            sum.allocated);
    STOWAGE_INTERNAL_ASSERT(stats_.active_bytes.of(pool).current == sum.allocated + sum.pending);
    STOWAGE_INTERNAL_ASSERT(stats_.requested_bytes.of(pool).current == sum.requested);
    STOWAGE_INTERNAL_ASSERT(stats_.segment.of(pool).current == sum.segments);
    STOWAGE_INTERNAL_ASSERT(stats_.allocation.of(pool).current == sum.allocations);
    STOWAGE_INTERNAL_ASSERT(stats_.active.of(pool).current == sum.active);
    STOWAGE_INTERNAL_ASSERT(stats_.inactive_split.of(pool).current == sum.inactive_split,
                            "inactive_split ", stats_.inactive_split.of(pool).current, " != ",
                            sum.inactive_split);
    STOWAGE_INTERNAL_ASSERT(stats_.inactive_split_bytes.of(pool).current ==
                            sum.inactive_split_bytes);
  }
  std::size_t mapped_pages = 0;
  for (const auto& [base, segment] : segments_) mapped_pages += segment.mapped_pages;
  STOWAGE_INTERNAL_ASSERT(stats_.mapped_pages.current == as_signed(mapped_pages),
                          "mapped_pages ", stats_.mapped_pages.current, " != ", mapped_pages);
  for (const PoolStats* pool_stats :
       {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
        &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
        &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
    STOWAGE_INTERNAL_ASSERT(pool_stats->stats[0].current ==
                            pool_stats->stats[1].current + pool_stats->stats[2].current);
  }
  for (const Block* block : deferred_frees_) {
    STOWAGE_INTERNAL_ASSERT(block->state == BlockState::kPendingFree && block->pending_events == 0);
  }
  for (const PendingEvent& pending : pending_events_) {
    STOWAGE_INTERNAL_ASSERT(pending.block->state == BlockState::kPendingFree &&
                            pending.block->pending_events > 0);
  }
}

}  // namespace stowage
