// CachingAllocator: the private pools' public face (Note [Private pools] in private_pools.hpp).
#include "allocator/caching_allocator.hpp"
#include "base/errors.hpp"

namespace stowage {

void CachingAllocator::create_or_incref_pool(PoolId id) {
  std::lock_guard lock(mutex_);
  private_pools_.create_or_incref(id);
}

void CachingAllocator::begin_allocate_to_pool(PoolId id, StreamFilter filter) {
  std::lock_guard lock(mutex_);
  private_pools_.begin_allocate(id, std::move(filter));
}

void CachingAllocator::end_allocate_to_pool(PoolId id) {
  std::lock_guard lock(mutex_);
  private_pools_.end_allocate(id);
}

void CachingAllocator::release_pool(PoolId id) {
  std::lock_guard lock(mutex_);
  // Memory goes back later when a capture is under way (cudaFree would break it).
  if (private_pools_.release(id) == 0 && !private_pools_.capturing()) {
    private_pools_.release_unused(/*all=*/false);
  }
}

bool CachingAllocator::release_pool_cache(PoolId id) {
  std::lock_guard lock(mutex_);
  STOWAGE_CHECK(!private_pools_.capturing(),
                "releasing a pool's cache during a CUDA graph capture would break the capture; "
                "release it before or after capturing");
  const PrivatePool* pool = private_pools_.find(id);
  if (pool == nullptr) return false;
  cache_.synchronize_pending();
  const bool released =
      segments_.release_free([&](const Segment& segment) { return segment.pool == pool; });
  private_pools_.release_unused(/*all=*/false);  // forgets the pool if nothing holds it
  return released;
}

int CachingAllocator::pool_use_count(PoolId id) const {
  std::lock_guard lock(mutex_);
  const PrivatePool* pool = private_pools_.find(id);
  return pool == nullptr ? 0 : pool->use_count;
}

void CachingAllocator::set_pool_use_on_oom(PoolId id, bool use_on_oom) {
  std::lock_guard lock(mutex_);
  private_pools_.get(id, "set_pool_use_on_oom").use_on_oom = use_on_oom;
}

void CachingAllocator::set_pool_no_split(PoolId id) {
  std::lock_guard lock(mutex_);
  private_pools_.get(id, "set_pool_no_split").no_split = true;
}

std::vector<void*> CachingAllocator::pool_allocations(PoolId id) const {
  std::lock_guard lock(mutex_);
  const PrivatePool* pool = private_pools_.find(id);
  if (pool == nullptr) return {};
  return stowage::pool_allocations(cache_, *pool);
}

PoolCheckpoint CachingAllocator::checkpoint_pool(PoolId id) const {
  std::lock_guard lock(mutex_);
  return stowage::checkpoint_pool(cache_, private_pools_.get(id, "checkpoint_pool"));
}

PoolRestore CachingAllocator::restore_pool(const PoolCheckpoint& checkpoint) {
  std::lock_guard lock(mutex_);
  const PoolId id = checkpoint.pool;
  PrivatePool& pool = private_pools_.get(id, "restore_pool");
  // A pool nobody holds gives its segments back as they become free: there is nothing to
  // restore into.
  STOWAGE_CHECK(pool.use_count > 0, "restore_pool: private pool (", id.first, ", ", id.second,
                ") is not held");
  return stowage::restore_pool(cache_, pool, checkpoint, config_.max_split_size);
}

}  // namespace stowage
