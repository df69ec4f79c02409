#include "allocator/pool_checkpoint.hpp"

#include <algorithm>

#include "base/errors.hpp"

namespace stowage {

namespace {

// Everything restore_pool needs to hold, checked before anything changes.
void check_restorable(const BlockCache& cache, const Pool& pool,
                      const PoolCheckpoint& checkpoint) {
  const PoolId id = pool.id();
  for (const PoolCheckpoint::SegmentRecord& record : checkpoint.segments) {
    const auto found = cache.segments().find(record.base);
    STOWAGE_CHECK(found != cache.segments().end() && found->second.pool == &pool,
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
  for (const auto& [base, segment] : cache.segments()) {
    if (segment.pool != &pool) continue;
    for (const Block* block = segment.first; block != nullptr; block = block->next) {
      STOWAGE_CHECK(block->state != BlockState::kPendingFree, "restore_pool: block ",
                    block->pointer(), " of the pool is still in use by another stream");
    }
  }
}

// Ends every allocation of the pool, recording them in `out`. They are listed first: freeing one
// coalesces it with free neighbours, whose records are recycled, so the block list cannot be
// walked meanwhile.
void end_allocations(BlockCache& cache, const Pool& pool, PoolRestore& out) {
  std::vector<Block*> live;
  for (auto& [base, segment] : cache.segments()) {
    if (segment.pool != &pool) continue;
    for (Block* block = segment.first; block != nullptr; block = block->next) {
      if (block->state == BlockState::kAllocated) live.push_back(block);
    }
  }
  for (Block* block : live) {
    out.freed.push_back(block->pointer());
    cache.end_allocation(block, 0);
    block->stream_uses.clear();
    cache.free_block(block);
  }
}

// Cuts a wholly free segment as the record says and allocates its allocated blocks again, with
// records taken from `spare`.
void recut_segment(BlockCache& cache, const PoolCheckpoint::SegmentRecord& record,
                   std::vector<Block*>& spare, std::size_t max_split_size, PoolRestore& out) {
  Segment& segment = cache.segments().at(record.base);
  Block* block = segment.first;
  STOWAGE_INTERNAL_ASSERT(segment.is_free(), "a segment of the pool is not free after freeing");
  cache.unindex(*block);
  std::vector<Block*> pieces;
  for (std::size_t i = 0; i < record.blocks.size(); ++i) {
    pieces.push_back(block);
    if (i + 1 < record.blocks.size()) {
      Block* rest = spare.back();
      spare.pop_back();
      BlockCache::split_after(block, record.blocks[i].size, rest);
      block = rest;
    }
  }
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const PoolCheckpoint::BlockRecord& state = record.blocks[i];
    if (state.allocated) {
      cache.mark_allocated(pieces[i], std::max<std::size_t>(state.requested, 1),
                           state.size >= max_split_size, state.context);
      out.allocated.push_back(pieces[i]->pointer());
    }
  }
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (!record.blocks[i].allocated) cache.insert_free(pieces[i]);
  }
}

}  // namespace

std::vector<void*> pool_allocations(const BlockCache& cache, const Pool& pool) {
  std::vector<void*> out;
  for (const auto& [base, segment] : cache.segments()) {
    if (segment.pool != &pool) continue;
    for (const Block* block = segment.first; block != nullptr; block = block->next) {
      if (block->state == BlockState::kAllocated) out.push_back(block->pointer());
    }
  }
  return out;
}

PoolCheckpoint checkpoint_pool(const BlockCache& cache, const Pool& pool) {
  PoolCheckpoint out;
  out.pool = pool.id();
  for (const auto& [base, segment] : cache.segments()) {
    if (segment.pool != &pool) continue;
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

PoolRestore restore_pool(BlockCache& cache, Pool& pool, const PoolCheckpoint& checkpoint,
                         std::size_t max_split_size) {
  check_restorable(cache, pool, checkpoint);
  // The block records the cuts need, taken now so that nothing fails halfway.
  std::vector<Block*> spare;
  try {
    for (const PoolCheckpoint::SegmentRecord& record : checkpoint.segments) {
      for (std::size_t i = 1; i < record.blocks.size(); ++i) spare.push_back(cache.acquire_block());
    }
  } catch (...) {
    for (Block* block : spare) cache.recycle_block(block);
    throw;
  }
  PoolRestore out;
  end_allocations(cache, pool, out);
  for (const PoolCheckpoint::SegmentRecord& record : checkpoint.segments) {
    recut_segment(cache, record, spare, max_split_size, out);
  }
  return out;
}

}  // namespace stowage
