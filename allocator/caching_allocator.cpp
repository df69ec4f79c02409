#include "allocator/caching_allocator.hpp"

#include <algorithm>

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "base/log.hpp"
#include "base/numbers.hpp"

namespace stowage {

namespace {

bool use_paged_memory(const DeviceBackend& backend, const AllocatorConfig& config) {
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

const AllocatorConfig& checked(const AllocatorConfig& config) {
  STOWAGE_CHECK(config.memory_fraction > 0 && config.memory_fraction <= 1,
                "memory_fraction must be in (0, 1], not ", config.memory_fraction);
  STOWAGE_CHECK(config.reserve_headroom >= 0 && config.reserve_headroom <= 1,
                "reserve_headroom must be in [0, 1], not ", config.reserve_headroom);
  return config;
}

std::unique_ptr<PagedSource> make_paged_source(const AllocatorConfig& config,
                                               const SourceParts& parts, bool device_memory) {
  if (!device_memory) {
    STOWAGE_CHECK(config.virtual_memory != VirtualMemoryMode::kOn, "virtual_memory:on, but ",
                  parts.segments.name(), " is not the device's memory");
    return nullptr;
  }
  if (!use_paged_memory(parts.backend, config)) return nullptr;
  return std::make_unique<PagedSource>(parts);
}

}  // namespace

CachingAllocator::CachingAllocator(DeviceBackend& backend, AllocatorConfig config)
    : CachingAllocator(backend, std::make_unique<DeviceSegments>(backend), nullptr, config) {}

CachingAllocator::CachingAllocator(DeviceBackend& backend, SegmentMemory& memory,
                                   AllocatorConfig config)
    : CachingAllocator(backend, nullptr, &memory, config) {}

CachingAllocator::CachingAllocator(DeviceBackend& backend, std::unique_ptr<DeviceSegments> owned,
                                   SegmentMemory* memory, AllocatorConfig config)
    : backend_(backend),
      device_segments_(std::move(owned)),
      segment_memory_(memory != nullptr ? *memory : *device_segments_),
      config_(checked(config)),
      limit_(segment_memory_.total_bytes(), config.limit_bytes, config.memory_fraction),
      cache_(backend, stats_, trace_, this),
      budget_(cache_, config.reserve_headroom,
              device_segments_ != nullptr && use_paged_memory(backend, config)
                  ? backend.properties().granularity
                  : SizePolicy::kMediumSegmentSize),
      segments_(parts()),
      paged_(make_paged_source(config, parts(), device_segments_ != nullptr)),
      source_(paged_ != nullptr ? static_cast<MemorySource&>(*paged_) : segments_),
      spare_whole_segments_(source_.spares_whole_segments()),
      splits_fresh_blocks_(source_.splits_fresh_blocks()),
      private_pools_(segments_) {
  stats_.max_split_size =
      config.max_split_size == AllocatorConfig::kUnlimited ? -1 : as_signed(config.max_split_size);
  if (config.placement != PlacementMode::kLearned) return;
  STOWAGE_CHECK(device_segments_ != nullptr, "placement:learned, but ", segment_memory_.name(),
                " is not the device's memory");
  if (paged_ != nullptr) {
    placement_ = std::make_unique<LearnedPlacement>(cache_, *paged_, shared_);
  } else {
    log_warning(detail::concat("placement:learned needs virtual memory, which ",
                               backend.properties().name,
                               " does not offer; allocations are placed dynamically"));
  }
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  try {
    cache_.synchronize_pending();
    release_cached_locked();
    private_pools_.release_unused(/*all=*/true);
  } catch (const std::exception& error) {
    log_warning(detail::concat("releasing cached memory at shutdown failed: ", error.what()));
  }
  if (cache_.allocated_blocks() > 0) {
    log_warning(detail::concat(cache_.allocated_blocks(), " block(s), ",
                               format_bytes(static_cast<std::size_t>(
                                   stats_.allocated_bytes.all().current)),
                               ", were still allocated when the allocator was destroyed; their "
                               "segments are left to the device"));
  }
}

// --- malloc ---

void* CachingAllocator::malloc(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  const std::uint64_t context = context_for_history();
  const bool representable = bytes <= SizePolicy::kMaxRequest;
  const std::size_t rounded = representable ? SizePolicy::block_size(bytes) : bytes;
  if (representable) {
    relieve_above_ceiling(rounded, stream);
    {
      std::lock_guard lock(mutex_);
      if (Block* block = try_malloc_locked(bytes, rounded, stream, context)) return block->pointer();
    }
    // Costly relief, without the lock: handlers free blocks through free().
    std::vector<MemoryPressureHandler*> handlers;
    {
      std::lock_guard lock(mutex_);
      // Eviction copies and waits, which a capture forbids (Note [Private pools]).
      if (!private_pools_.capturing()) handlers = pressure_handlers_;
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
    trace_.record(TraceAction::kOom, report.device_free, bytes, stream, context);
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

void CachingAllocator::relieve_above_ceiling(std::size_t rounded, Stream stream) {
  const std::size_t ceiling = allocated_ceiling_.load(std::memory_order_relaxed);
  if (ceiling == kNoCeiling) return;
  std::size_t excess = 0;
  std::vector<MemoryPressureHandler*> handlers;
  {
    std::lock_guard lock(mutex_);
    if (private_pools_.capturing()) return;
    const auto allocated = static_cast<std::size_t>(stats_.allocated_bytes.all().current);
    if (allocated + rounded <= ceiling) return;
    excess = allocated + rounded - std::max(ceiling, allocated);  // past the ceiling, at most rounded
    handlers = pressure_handlers_;
  }
  for (MemoryPressureHandler* handler : handlers) {
    const std::size_t freed = handler->relieve_pressure(excess, stream);
    if (freed >= excess) return;
    excess -= freed;
  }
}

Block* CachingAllocator::try_malloc_locked(std::size_t bytes, std::size_t rounded, Stream stream,
                                           std::uint64_t context) {
  const TraceRecorder::ContextScope scope(trace_, context);  // segments given back to make room
  const bool capturing = private_pools_.capturing();
  if (!capturing) {
    cache_.flush_deferred();
    cache_.process_events();
  }
  const GrowRequest request{SizePolicy::size_class_for(rounded), stream, rounded, context,
                            capturing};
  const bool oversize = rounded >= config_.max_split_size;
  if (PrivatePool* pool = capturing ? private_pools_.capture_pool(stream) : nullptr) {
    // Note [Private pools]: the pool's own blocks, else a segment of its own.
    Block* block = find_cached_locked(*pool, request, oversize);
    if (block == nullptr) block = segments_.allocate(*pool, request);
    if (block == nullptr) return nullptr;
    return claim_locked(block, bytes, rounded, oversize, /*fresh=*/false, context);
  }
  // Note [Learned placement]: the layout's address for this request, when a layout is in force.
  const bool learning =
      placement_ != nullptr && request.size_class == SizeClass::kLarge && !capturing;
  bool commit_when_served = false;
  if (learning) {
    if (Block* placed = placement_->place(rounded, stream, context, commit_when_served)) {
      return claim_locked(placed, bytes, rounded, oversize, /*fresh=*/false, context);
    }
  }
  bool fresh = false;
  Block* block = find_cached_locked(shared_, request, oversize, spare_whole_segments_);
  if (block == nullptr) block = miss_locked(request, oversize, fresh, commit_when_served);
  if (block == nullptr) return nullptr;
  Block* claimed = claim_locked(block, bytes, rounded, oversize, fresh, context);
  if (commit_when_served) placement_->commit_served();
  if (learning) placement_->learn(*claimed, rounded, stream);
  return claimed;
}

Block* CachingAllocator::miss_locked(const GrowRequest& request, bool oversize, bool& fresh,
                                     bool& commit_when_served) {
  auto grow = [&](Block* (MemorySource::*step)(const GrowRequest&)) {
    fresh = splits_fresh_blocks_;
    return (source_.*step)(request);
  };
  Block* block = grow(&MemorySource::grow);
  // The segment path spared wholly free segments much larger than the request while the device
  // could give a new one (Note [Splitting]); failing that, it carves them after all.
  if (block == nullptr && spare_whole_segments_) block = find_cached_locked(shared_, request, oversize);
  if (request.capturing) return block;  // no waiting, nothing given back
  if (block == nullptr && placement_ != nullptr && placement_->has_arena()) {
    // The layout's arena holds free memory the dynamic path cannot reach: give the layout up rather
    // than fail.
    placement_->give_up();
    commit_when_served = false;
    fresh = false;
    block = find_cached_locked(shared_, request, oversize);
    if (block == nullptr) block = grow(&MemorySource::grow);
  }
  if (block == nullptr) {
    // Wait for pending frees (they may complete a fitting block), then ask again.
    ++stats_.num_alloc_retries;
    cache_.synchronize_pending();
    fresh = false;
    block = find_cached_locked(shared_, request, oversize);
    if (block == nullptr) {
      private_pools_.release_unused(/*all=*/false);
      block = grow(&MemorySource::grow_again);
    }
  }
  if (block == nullptr) {
    // Last, the free blocks of private pools that lend theirs rather than see an OOM (torch's
    // MemPool(use_on_oom=True)); the block stays the pool's and returns to it when freed.
    fresh = false;
    for (PrivatePool* lender : private_pools_.lenders()) {
      block = find_cached_locked(*lender, request, oversize);
      if (block != nullptr) break;
    }
  }
  return block;
}

Block* CachingAllocator::find_cached_locked(Pool& pool, const GrowRequest& request,
                                            bool oversize, bool spare_whole_segments) {
  FreeBlockIndex& index = pool.cached(request.size_class);
  Block* block = index.best_fit(request.stream, request.rounded);
  if (block == nullptr) return nullptr;
  if (spare_whole_segments && !block->is_split() &&
      SizePolicy::spares_whole_segment(block->size, request.rounded)) {
    return nullptr;
  }
  // Oversize blocks serve oversize requests only, and only when they waste at most one medium
  // segment's worth: carving them up is what strands huge holes. (A block no bigger than the
  // segment this request would get is fair game, oversize or not.)
  if (!oversize && block->size >= config_.max_split_size &&
      block->size > SizePolicy::segment_size(request.rounded)) {
    return nullptr;
  }
  if (oversize && block->size - request.rounded >= SizePolicy::kMediumSegmentSize) return nullptr;
  cache_.unindex(*block);
  return block;
}

Block* CachingAllocator::claim_locked(Block* block, std::size_t bytes, std::size_t rounded,
                                      bool oversize, bool fresh, std::uint64_t context) {
  const Segment& segment = *block->segment;
  // A block the paged path has just formed from new pages may be split even for an oversize
  // request: its remainder is the partial page at its end, not part of a huge cached block.
  const bool split = !segment.pool->no_split &&
                     SizePolicy::should_split(segment.size_class, block->size - rounded,
                                              oversize && !fresh, segment.pages != nullptr);
  cache_.claim(block, bytes, rounded, split, oversize, context);
  return block;
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
  Block* block = cache_.find_allocated(reinterpret_cast<std::uintptr_t>(ptr));
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
  if (placement_ != nullptr) placement_->note_free(*block);
  cache_.end_allocation(block, context);
  if (!block->stream_uses.empty() && private_pools_.capturing()) {
    // Events recorded now would join the capture: they are recorded when it ends.
    cache_.defer_free(block);
    return;
  }
  cache_.free_after_streams(block);
}

void CachingAllocator::block_freed(Block& block) {
  const Pool& pool = *block.segment->pool;
  if (pool.id() == kSharedPoolId) return;
  const PrivatePool* owner = private_pools_.find(pool.id());
  if (owner != nullptr && owner->use_count == 0 && block.segment->is_free() &&
      !private_pools_.capturing()) {
    private_pools_.release_unused(/*all=*/false);
  }
}

void CachingAllocator::record_stream(void* ptr, Stream stream) {
  std::lock_guard lock(mutex_);
  Block* block = cache_.find_allocated(reinterpret_cast<std::uintptr_t>(ptr));
  STOWAGE_CHECK(block != nullptr, "record_stream of ", ptr,
                ", which is not a live allocation of this allocator");
  BlockCache::record_stream(*block, stream);
}

// --- releasing memory ---

bool CachingAllocator::release_cached_locked() {
  // The layout's arena goes back like any cache; learning starts again.
  if (placement_ != nullptr) placement_->drop();
  const bool released = private_pools_.release_unused(/*all=*/false);
  return source_.release_cached() || released;
}

void CachingAllocator::empty_cache() {
  const std::uint64_t context = context_for_history();
  std::lock_guard lock(mutex_);
  const TraceRecorder::ContextScope scope(trace_, context);
  STOWAGE_CHECK(!private_pools_.capturing(),
                "empty_cache during a CUDA graph capture: giving memory back needs a device "
                "synchronisation, which would break the capture; call it before or after "
                "capturing");
  cache_.flush_deferred();
  cache_.synchronize_pending();
  release_cached_locked();
}

void CachingAllocator::release_free_segments(SizeClass size_class) {
  const std::uint64_t context = context_for_history();
  std::lock_guard lock(mutex_);
  const TraceRecorder::ContextScope scope(trace_, context);
  STOWAGE_CHECK(!private_pools_.capturing(),
                "release_free_segments during a CUDA graph capture: it needs a device "
                "synchronisation, which would break the capture");
  cache_.flush_deferred();
  cache_.synchronize_pending();
  segments_.release_free([&](const Segment& segment) {
    return segment.pool == &shared_ && segment.size_class == size_class;
  });
}

// --- limits ---

void CachingAllocator::set_memory_fraction(double fraction) {
  std::lock_guard lock(mutex_);
  limit_.set_fraction(fraction);
}

void CachingAllocator::set_limit(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  limit_.set_bytes(bytes);
}

std::size_t CachingAllocator::limit() const {
  std::lock_guard lock(mutex_);
  return limit_.bytes();
}

std::string CachingAllocator::limit_bound() const {
  std::lock_guard lock(mutex_);
  return limit_.bound_name();
}

double CachingAllocator::memory_fraction() const {
  std::lock_guard lock(mutex_);
  return limit_.fraction();
}

// --- placement ---

void CachingAllocator::mark_fit_trial(bool begin) {
  const std::uint64_t context = context_for_history();
  std::lock_guard lock(mutex_);
  trace_.record(begin ? TraceAction::kFitTrialBegin : TraceAction::kFitTrialEnd, 0, 0, Stream{}, context);
}

void CachingAllocator::mark_step() {
  const std::uint64_t context = context_for_history();
  std::lock_guard lock(mutex_);
  trace_.record(TraceAction::kMarkStep, 0, 0, Stream{}, context);
  const StepCalls now = stats_.calls_so_far();
  stats_.last_step = {now.maps - step_start_.maps, now.unmaps - step_start_.unmaps,
                      now.device_calls - step_start_.device_calls,
                      now.device_call_ns - step_start_.device_call_ns};
  step_start_ = now;
  ++stats_.num_steps;
  if (placement_ != nullptr) placement_->mark_step();
}

CachingAllocator::PlacementStatus CachingAllocator::placement_status() const {
  std::lock_guard lock(mutex_);
  return placement_ != nullptr ? placement_->status() : PlacementStatus{};
}

// --- handlers and observers ---

void CachingAllocator::set_allocated_ceiling(std::size_t bytes) noexcept {
  allocated_ceiling_.store(bytes, std::memory_order_relaxed);
}

std::size_t CachingAllocator::allocated_ceiling() const noexcept {
  return allocated_ceiling_.load(std::memory_order_relaxed);
}

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

// --- invariants ---

void CachingAllocator::check_invariants() const {
  std::lock_guard lock(mutex_);
  std::vector<const Pool*> pools = private_pools_.pools();
  pools.push_back(&shared_);
  if (placement_ != nullptr) {
    pools.push_back(&placement_->arena_pool());
    placement_->check_invariants();
  }
  cache_.check_invariants(pools);
  const Pool* arena = placement_ != nullptr ? &placement_->arena_pool() : nullptr;
  for (const auto& [base, segment] : cache_.segments()) {
    const bool shared = segment.pool == &shared_ || segment.pool == arena;
    STOWAGE_INTERNAL_ASSERT((segment.pages != nullptr) == (paged_ != nullptr && shared),
                            "segment ", base, " is of the wrong path");
  }
}

}  // namespace stowage
