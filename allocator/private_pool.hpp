// Private pools: memory set apart for one owner, such as a CUDA graph or a torch MemPool
// (Note [Private pools] in caching_allocator.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "allocator/device/backend.hpp"
#include "allocator/free_block_index.hpp"
#include "allocator/size_policy.hpp"

namespace stowage {

// torch's MempoolId_t: (0, 0) names the shared pools; any other pair a private pool.
using PoolId = std::pair<unsigned long long, unsigned long long>;  // NOLINT(google-runtime-int)

// One private pool's free blocks, apart from everyone else's. Owned by the CachingAllocator
// and guarded by its lock; a pool lives while its use count is positive or it holds segments.
struct PrivatePool {
  PoolId id;
  int use_count = 0;          // holders: graphs and MemPools that share it
  std::size_t segments = 0;   // segments it owns
  bool use_on_oom = false;    // its free blocks may serve others' requests rather than an OOM
  bool no_split = false;      // its blocks are handed out whole, never cut
  FreeBlockIndex free[2];     // small, large

  FreeBlockIndex& index(Pool pool) noexcept { return free[pool == Pool::kSmall ? 0 : 1]; }
};

// A private pool's layout at one moment: each segment's blocks in address order, and which
// were allocated. restore_pool() puts a pool back into this layout (torch's cudagraph trees
// checkpoint a pool after recording a graph and return to the checkpoint before the next one).
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

// What restore_pool() did: the allocations it ended (their owners must forget them) and the
// ones it made again, at the addresses they had at the checkpoint.
struct PoolRestore {
  std::vector<void*> freed;
  std::vector<void*> allocated;
};

}  // namespace stowage
