#include "allocator/block_cache.hpp"

#include <algorithm>
#include <exception>
#include <new>

#include "base/errors.hpp"
#include "base/log.hpp"
#include "base/numbers.hpp"

namespace stowage {

BlockCache::BlockCache(DeviceBackend& backend, DeviceStats& stats, TraceRecorder& trace,
                       Listener* listener)
    : backend_(backend), stats_(stats), trace_(trace), listener_(listener) {}

BlockCache::~BlockCache() {
  for (const Event event : spare_events_) {
    try {
      backend_.destroy_event(event);
    } catch (...) {
      // The device is going away; nothing more to do.
    }
  }
}

// --- segments ---

Block* BlockCache::add_segment(std::uintptr_t base, std::size_t size, Stream stream,
                               SizeClass size_class, std::uint64_t context, Pool& pool,
                               PageTable* pages) {
  STOWAGE_INTERNAL_ASSERT(!segments_.contains(base), "a segment at ", base,
                          " is already recorded");
  Block* block = store_.acquire();
  Segment* added = nullptr;
  try {
    added = &segments_[base];
  } catch (...) {
    store_.recycle(block);
    throw;
  }
  Segment& segment = *added;
  segment.base = base;
  segment.size = size;
  segment.stream = stream;
  segment.size_class = size_class;
  segment.context = context;
  segment.pool = &pool;
  segment.pages = pages;
  segment.first = block;
  block->address = base;
  block->size = size;
  block->stream = stream;
  block->segment = &segment;
  block->mapped = pages == nullptr;
  ++pool.segments;
  return block;
}

void BlockCache::remove_segment(Segment& segment) noexcept {
  --segment.pool->segments;
  store_.recycle(segment.first);
  segments_.erase(segment.base);
}

// --- free blocks ---

void BlockCache::split_after(Block* block, std::size_t keep, Block* rest) noexcept {
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

void BlockCache::index(Block& block) {
  block.segment->pool->index_for(block).insert(block);
  count_inactive_split(block, 1);
}

void BlockCache::unindex(Block& block) {
  count_inactive_split(block, -1);
  block.segment->pool->index_for(block).erase(block);
}

Block* BlockCache::insert_free(Block* block) {
  auto mergeable = [&](const Block* neighbour) {
    return neighbour != nullptr && neighbour->state == BlockState::kFree &&
           neighbour->mapped == block->mapped;
  };
  if (Block* prev = block->prev; mergeable(prev)) {
    unindex(*prev);
    block->address = prev->address;
    block->size += prev->size;
    block->prev = prev->prev;
    if (block->prev != nullptr) {
      block->prev->next = block;
    } else {
      block->segment->first = block;
    }
    store_.recycle(prev);
  }
  if (Block* next = block->next; mergeable(next)) {
    unindex(*next);
    block->size += next->size;
    block->next = next->next;
    if (block->next != nullptr) block->next->prev = block;
    store_.recycle(next);
  }
  index(*block);
  return block;
}

void BlockCache::count_inactive_split(const Block& block, int sign) {
  if (!block.is_split() || !block.mapped) return;
  const SizeClass size_class = block.segment->size_class;
  stats_.inactive_split.update(size_class, sign);
  stats_.inactive_split_bytes.update(size_class, sign * as_signed(block.size));
}

// --- allocation ---

void BlockCache::claim(Block* block, std::size_t bytes, std::size_t rounded, bool split,
                       bool oversize, std::uint64_t context) {
  Block* rest = nullptr;
  if (split) {
    try {
      rest = store_.acquire();
    } catch (const std::bad_alloc&) {
      rest = nullptr;  // no memory for bookkeeping: hand out the whole block unsplit
    }
  }
  if (rest != nullptr) {
    split_after(block, rounded, rest);
    index(*rest);
  }
  mark_allocated(block, bytes, oversize, context);
}

void BlockCache::mark_allocated(Block* block, std::size_t bytes, bool oversize,
                                std::uint64_t context) {
  const SizeClass size_class = block->segment->size_class;
  block->state = BlockState::kAllocated;
  block->requested = bytes;
  block->oversize = oversize;
  block->context = context;
  allocated_.insert(*block);
  stats_.allocation.update(size_class, 1);
  stats_.allocated_bytes.update(size_class, as_signed(block->size));
  stats_.requested_bytes.update(size_class, as_signed(bytes));
  stats_.active.update(size_class, 1);
  stats_.active_bytes.update(size_class, as_signed(block->size));
  active_high_water_ = std::max(active_high_water_, active_bytes());
  if (oversize) stats_.oversize_allocations.update(1);
  trace_.record(TraceAction::kAlloc, block->address, bytes, block->stream, context);
}

// --- freeing ---

void BlockCache::record_stream(Block& block, Stream stream) {
  if (stream == block.stream) return;
  if (std::find(block.stream_uses.begin(), block.stream_uses.end(), stream) ==
      block.stream_uses.end()) {
    block.stream_uses.push_back(stream);
  }
}

void BlockCache::end_allocation(Block* block, std::uint64_t context) {
  allocated_.erase(*block);
  const SizeClass size_class = block->segment->size_class;
  stats_.allocation.update(size_class, -1);
  stats_.allocated_bytes.update(size_class, -as_signed(block->size));
  stats_.requested_bytes.update(size_class, -as_signed(block->requested));
  if (block->oversize) stats_.oversize_allocations.update(-1);
  trace_.record(TraceAction::kFreeRequested, block->address, block->requested, block->stream,
                context);
}

void BlockCache::free_after_streams(Block* block) {
  if (block->stream_uses.empty()) {
    free_block(block);
    return;
  }
  block->state = BlockState::kPendingFree;
  try {
    for (const Stream use : block->stream_uses) {
      const Event event = acquire_event();
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
      log_warning(detail::concat("block ", block->pointer(),
                                 " cannot be reused: recording an event failed (", error.what(),
                                 ") and so did waiting for its streams (", second.what(), ")"));
      synchronized = false;
    }
    std::erase_if(pending_events_, [&](const PendingEvent& pending) {
      if (pending.block != block) return false;
      spare_events_.push_back(pending.event);
      return true;
    });
    block->pending_events = 0;
    if (synchronized) free_block(block);
  }
}

void BlockCache::defer_free(Block* block) {
  block->state = BlockState::kPendingFree;
  deferred_frees_.push_back(block);
}

void BlockCache::flush_deferred() {
  if (deferred_frees_.empty()) return;
  std::vector<Block*> blocks;
  blocks.swap(deferred_frees_);
  for (Block* block : blocks) free_after_streams(block);
}

Event BlockCache::acquire_event() {
  if (!spare_events_.empty()) {
    const Event event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  return backend_.create_event();
}

void BlockCache::process_events() {
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
    if (--pending.block->pending_events == 0) free_block(pending.block);
  }
  pending_events_.resize(kept);
}

void BlockCache::synchronize_pending() {
  if (pending_events_.empty()) return;
  ++stats_.num_sync_all_streams;
  for (const PendingEvent& pending : pending_events_) backend_.synchronize_event(pending.event);
  process_events();
}

void BlockCache::free_block(Block* block) {
  const SizeClass size_class = block->segment->size_class;
  stats_.active.update(size_class, -1);
  stats_.active_bytes.update(size_class, -as_signed(block->size));
  trace_.record(TraceAction::kFreeCompleted, block->address, block->requested, block->stream,
                block->context);
  block->state = BlockState::kFree;
  block->requested = 0;
  block->oversize = false;
  block->context = 0;
  block->stream_uses.clear();
  Block* freed = insert_free(block);
  if (listener_ != nullptr) listener_->block_freed(*freed);
}

}  // namespace stowage
