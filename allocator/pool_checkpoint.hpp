// A private pool's layout at one moment, and the way back to it (Note [Private pools] in
// private_pools.hpp): torch's cudagraph trees checkpoint a pool after recording a graph and
// return to the checkpoint before recording the next one.
//
// Contract: functions over the allocator's BlockCache, called under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/block_cache.hpp"
#include "allocator/pool.hpp"

namespace stowage {

// Each segment's blocks in address order, and which were allocated.
struct PoolCheckpoint {
  struct BlockRecord {
    std::size_t size = 0;
    std::size_t requested = 0;  // 0 for blocks that were not allocated
    bool allocated = false;
    std::uint64_t context = 0;
  };
  struct SegmentRecord {
    std::uintptr_t base = 0;
    std::vector<BlockRecord> blocks;
  };
  PoolId pool;
  std::vector<SegmentRecord> segments;
};

// What restore_pool did: the allocations it ended (their owners must forget them) and the ones
// it made again, at the addresses they had at the checkpoint.
struct PoolRestore {
  std::vector<void*> freed;
  std::vector<void*> allocated;
};

// The allocated blocks of `pool`, in address order.
std::vector<void*> pool_allocations(const BlockCache& cache, const Pool& pool);
PoolCheckpoint checkpoint_pool(const BlockCache& cache, const Pool& pool);
// Frees every allocation of `pool` and allocates again those that were allocated at the
// checkpoint, at the same addresses. Throws LogicError, with nothing changed, when the pool's
// segments no longer match the checkpoint or a block of the pool is still in use by a stream.
// Blocks of max_split_size or more count as oversize.
PoolRestore restore_pool(BlockCache& cache, Pool& pool, const PoolCheckpoint& checkpoint,
                         std::size_t max_split_size);

}  // namespace stowage
