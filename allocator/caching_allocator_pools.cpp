// CachingAllocator: private pools, captures and pool checkpoints (Note [Private pools]), and the
// questions torch asks about memory (base_allocation, largest_available_block).
#include <algorithm>

#include "allocator/caching_allocator.hpp"
#include "allocator/base/errors.hpp"
#include "allocator/base/log.hpp"

namespace stowage {

namespace {

constexpr PoolId kSharedPools{0, 0};

}  // namespace

PrivatePool* CachingAllocator::capture_pool_locked(Stream stream) const {
  for (const auto& [pool, filter] : captures_) {
    if (filter(stream)) return pool;
  }
  return nullptr;
}

PrivatePool* CachingAllocator::find_pool_locked(PoolId id) const {
  const auto found = private_pools_.find(id);
  return found == private_pools_.end() ? nullptr : found->second.get();
}

PrivatePool& CachingAllocator::create_or_incref_pool_locked(PoolId id) {
  STOWAGE_CHECK(id != kSharedPools, "pool id (0, 0) names the shared pools, not a private pool");
  std::unique_ptr<PrivatePool>& pool = private_pools_[id];
  if (pool == nullptr) {
    pool = std::make_unique<PrivatePool>();
    pool->id = id;
  }
  ++pool->use_count;
  return *pool;
}

void CachingAllocator::create_or_incref_pool(PoolId id) {
  std::lock_guard lock(mutex_);
  create_or_incref_pool_locked(id);
}

void CachingAllocator::begin_allocate_to_pool(PoolId id, StreamFilter filter) {
  STOWAGE_CHECK(static_cast<bool>(filter), "begin_allocate_to_pool needs a stream filter");
  std::lock_guard lock(mutex_);
  for (const auto& [pool, unused] : captures_) {
    STOWAGE_CHECK(pool->id != id, "already allocating to private pool (", id.first, ", ",
                  id.second, ")");
  }
  PrivatePool& pool = create_or_incref_pool_locked(id);
  captures_.emplace_back(&pool, std::move(filter));
}

void CachingAllocator::end_allocate_to_pool(PoolId id) {
  std::lock_guard lock(mutex_);
  const auto found = std::find_if(captures_.begin(), captures_.end(),
                                  [&](const auto& capture) { return capture.first->id == id; });
  STOWAGE_CHECK(found != captures_.end(), "end_allocate_to_pool: not allocating to private pool (",
                id.first, ", ", id.second, ")");
  captures_.erase(found);
}

void CachingAllocator::release_pool(PoolId id) {
  std::lock_guard lock(mutex_);
  PrivatePool* pool = find_pool_locked(id);
  STOWAGE_CHECK(pool != nullptr && pool->use_count > 0, "release_pool: private pool (", id.first,
                ", ", id.second, ") is not held");
  // Memory goes back later when a capture is under way (cudaFree would break it).
  if (--pool->use_count == 0 && !capturing()) release_private_segments_locked(/*all=*/false);
}

bool CachingAllocator::release_pool_cache(PoolId id) {
  std::lock_guard lock(mutex_);
  STOWAGE_CHECK(!capturing(), "releasing a pool's cache during a CUDA graph capture would break "
                "the capture; release it before or after capturing");
  PrivatePool* pool = find_pool_locked(id);
  if (pool == nullptr) return false;
  synchronize_pending_locked();
  bool released =
      release_free_segments_locked([&](const Segment& segment) { return segment.owner == pool; });
  release_private_segments_locked(/*all=*/false);  // forgets the pool if nothing holds it
  return released;
}

int CachingAllocator::pool_use_count(PoolId id) const {
  std::lock_guard lock(mutex_);
  const PrivatePool* pool = find_pool_locked(id);
  return pool == nullptr ? 0 : pool->use_count;
}

bool CachingAllocator::release_private_segments_locked(bool all) {
  const bool released = release_free_segments_locked([all](const Segment& segment) {
    return segment.owner != nullptr && (all || segment.owner->use_count == 0);
  });
  std::erase_if(private_pools_, [&](const auto& entry) {
    const PrivatePool& pool = *entry.second;
    const bool in_capture = std::any_of(captures_.begin(), captures_.end(),
                                        [&](const auto& capture) { return capture.first == &pool; });
    return pool.use_count == 0 && pool.segments == 0 && !in_capture;
  });
  return released;
}

void CachingAllocator::flush_deferred_frees_locked() {
  if (deferred_frees_.empty()) return;
  std::vector<Block*> blocks;
  blocks.swap(deferred_frees_);
  for (Block* block : blocks) await_stream_uses_locked(block);
}

void CachingAllocator::set_pool_use_on_oom(PoolId id, bool use_on_oom) {
  std::lock_guard lock(mutex_);
  PrivatePool* pool = find_pool_locked(id);
  STOWAGE_CHECK(pool != nullptr, "set_pool_use_on_oom: there is no private pool (", id.first,
                ", ", id.second, ")");
  pool->use_on_oom = use_on_oom;
}

void CachingAllocator::set_pool_no_split(PoolId id) {
  std::lock_guard lock(mutex_);
  PrivatePool* pool = find_pool_locked(id);
  STOWAGE_CHECK(pool != nullptr, "set_pool_no_split: there is no private pool (", id.first, ", ",
                id.second, ")");
  pool->no_split = true;
}

std::vector<void*> CachingAllocator::pool_allocations(PoolId id) const {
  std::lock_guard lock(mutex_);
  std::vector<void*> out;
  const PrivatePool* pool = find_pool_locked(id);
  if (pool == nullptr) return out;
  for (const auto& [base, segment] : segments_) {
    if (segment.owner != pool) continue;
    for (const Block* block = segment.first; block != nullptr; block = block->next) {
      if (block->state == BlockState::kAllocated) out.push_back(block->pointer());
    }
  }
  return out;
}

PoolCheckpoint CachingAllocator::checkpoint_pool(PoolId id) const {
  std::lock_guard lock(mutex_);
  const PrivatePool* pool = find_pool_locked(id);
  STOWAGE_CHECK(pool != nullptr, "checkpoint_pool: there is no private pool (", id.first, ", ",
                id.second, ")");
  PoolCheckpoint out;
  out.pool = id;
  for (const auto& [base, segment] : segments_) {
    if (segment.owner != pool) continue;
    PoolCheckpoint::SegmentRecord& record = out.segments.emplace_back();
    record.base = base;
    for (const Block* block = segment.first; block != nullptr; block = block->next) {
      const bool allocated = block->state == BlockState::kAllocated;
      record.blocks.push_back(
          {block->size, allocated ? block->requested : 0, allocated, block->context});
    }
  }
  return out;
}

PoolRestore CachingAllocator::restore_pool(const PoolCheckpoint& checkpoint) {
  std::lock_guard lock(mutex_);
  const PoolId id = checkpoint.pool;
  PrivatePool* pool = find_pool_locked(id);
  STOWAGE_CHECK(pool != nullptr, "restore_pool: there is no private pool (", id.first, ", ",
                id.second, ")");
  // A pool nobody holds gives its segments back as they become free: there is nothing to
  // restore into.
  STOWAGE_CHECK(pool->use_count > 0, "restore_pool: private pool (", id.first, ", ", id.second,
                ") is not held");
  // Check everything first, so a mismatch changes nothing.
  for (const PoolCheckpoint::SegmentRecord& record : checkpoint.segments) {
    const auto found = segments_.find(record.base);
    STOWAGE_CHECK(found != segments_.end() && found->second.owner == pool,
                  "restore_pool: segment ", record.base, " of the checkpoint is no longer in "
                  "private pool (", id.first, ", ", id.second, ")");
    std::size_t total = 0;
    for (const PoolCheckpoint::BlockRecord& block : record.blocks) {
      STOWAGE_CHECK(block.size > 0 && block.size % SizePolicy::kMinBlockSize == 0,
                    "restore_pool: a block of ", block.size, " bytes in the checkpoint");
      total += block.size;
    }
    STOWAGE_CHECK(total == found->second.size, "restore_pool: the checkpoint's blocks cover ",
                  total, " bytes of segment ", record.base, ", which has ", found->second.size);
  }
  for (const auto& [base, segment] : segments_) {
    if (segment.owner != pool) continue;
    for (const Block* block = segment.first; block != nullptr; block = block->next) {
      STOWAGE_CHECK(block->state != BlockState::kPendingFree, "restore_pool: block ",
                    block->pointer(), " of the pool is still in use by another stream");
    }
  }
  // The block records the cuts need, taken now so that nothing fails halfway.
  std::vector<Block*> spare;
  try {
    for (const PoolCheckpoint::SegmentRecord& record : checkpoint.segments) {
      for (std::size_t i = 1; i < record.blocks.size(); ++i) spare.push_back(arena_.acquire());
    }
  } catch (...) {
    for (Block* block : spare) arena_.recycle(block);
    throw;
  }
  // End every allocation of the pool. They are listed first: freeing one coalesces it with
  // free neighbours, whose records are recycled, so the block list cannot be walked meanwhile.
  std::vector<Block*> live;
  for (const auto& [base, segment] : segments_) {
    if (segment.owner != pool) continue;
    for (Block* block = segment.first; block != nullptr; block = block->next) {
      if (block->state == BlockState::kAllocated) live.push_back(block);
    }
  }
  PoolRestore out;
  for (Block* block : live) {
    out.freed.push_back(block->pointer());
    end_allocation_locked(block, 0);
    block->stream_uses.clear();
    free_block_locked(block);
  }
  // Each checkpointed segment is now one free block: cut it as it was, and allocate again.
  for (const PoolCheckpoint::SegmentRecord& record : checkpoint.segments) {
    Segment& segment = segments_.at(record.base);
    Block* block = segment.first;
    STOWAGE_INTERNAL_ASSERT(segment.is_free(), "a segment of the pool is not free after freeing");
    index_for(*block).erase(*block);
    count_inactive_split_locked(*block, -1);
    std::vector<Block*> pieces;
    for (std::size_t i = 0; i < record.blocks.size(); ++i) {
      pieces.push_back(block);
      if (i + 1 < record.blocks.size()) {
        Block* rest = spare.back();
        spare.pop_back();
        split_after_locked(block, record.blocks[i].size, rest);
        block = rest;
      }
    }
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const PoolCheckpoint::BlockRecord& state = record.blocks[i];
      if (state.allocated) {
        mark_allocated_locked(pieces[i], std::max<std::size_t>(state.requested, 1),
                              state.size >= config_.max_split_size, state.context);
        out.allocated.push_back(pieces[i]->pointer());
      }
    }
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      if (!record.blocks[i].allocated) insert_free_locked(pieces[i]);
    }
  }
  return out;
}

std::pair<void*, std::size_t> CachingAllocator::base_allocation(const void* ptr) const {
  std::lock_guard lock(mutex_);
  const Block* block = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (block == nullptr) return {nullptr, 0};
  if (!block->segment->paged) {
    return {reinterpret_cast<void*>(block->segment->base), block->segment->size};
  }
  // The run of mapped pages around the block: between the holes on either side.
  const Block* first = block;
  while (first->prev != nullptr && first->prev->mapped) first = first->prev;
  std::size_t bytes = 0;
  for (const Block* b = first; b != nullptr && b->mapped; b = b->next) bytes += b->size;
  return {first->pointer(), bytes};
}

std::size_t CachingAllocator::largest_available_block() const {
  std::lock_guard lock(mutex_);
  std::size_t largest = 0;
  pools_[1].for_each([&](const Block& block) { largest = std::max(largest, block.size); });
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
  const std::size_t limit = limit_locked();
  std::size_t device_free = 0;
  try {
    device_free = backend_.memory_info().free_bytes;
  } catch (const std::exception&) {
    device_free = 0;
  }
  const std::size_t headroom = reserved < limit ? std::min(device_free, limit - reserved) : 0;
  return std::max(largest, headroom);
}

}  // namespace stowage
