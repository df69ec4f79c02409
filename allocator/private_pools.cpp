#include "allocator/private_pools.hpp"

#include <algorithm>

#include "base/errors.hpp"

namespace stowage {

PrivatePool* PrivatePools::capture_pool(Stream stream) const {
  for (const auto& [pool, filter] : captures_) {
    if (filter(stream)) return pool;
  }
  return nullptr;
}

PrivatePool* PrivatePools::find(PoolId id) const {
  const auto found = pools_.find(id);
  return found == pools_.end() ? nullptr : found->second.get();
}

PrivatePool& PrivatePools::get(PoolId id, const char* what) const {
  PrivatePool* pool = find(id);
  STOWAGE_CHECK(pool != nullptr, what, ": there is no private pool (", id.first, ", ", id.second,
                ")");
  return *pool;
}

PrivatePool& PrivatePools::create_or_incref(PoolId id) {
  STOWAGE_CHECK(id != kSharedPoolId, "pool id (0, 0) names the shared pool, not a private pool");
  std::unique_ptr<PrivatePool>& pool = pools_[id];
  if (pool == nullptr) pool = std::make_unique<PrivatePool>(id);
  ++pool->use_count;
  return *pool;
}

void PrivatePools::begin_allocate(PoolId id, StreamFilter filter) {
  STOWAGE_CHECK(static_cast<bool>(filter), "begin_allocate_to_pool needs a stream filter");
  for (const auto& [pool, unused] : captures_) {
    STOWAGE_CHECK(pool->id() != id, "already allocating to private pool (", id.first, ", ",
                  id.second, ")");
  }
  PrivatePool& pool = create_or_incref(id);
  captures_.emplace_back(&pool, std::move(filter));
}

void PrivatePools::end_allocate(PoolId id) {
  const auto found = std::find_if(captures_.begin(), captures_.end(),
                                  [&](const auto& capture) { return capture.first->id() == id; });
  STOWAGE_CHECK(found != captures_.end(), "end_allocate_to_pool: not allocating to private pool (",
                id.first, ", ", id.second, ")");
  captures_.erase(found);
}

int PrivatePools::release(PoolId id) {
  PrivatePool* pool = find(id);
  STOWAGE_CHECK(pool != nullptr && pool->use_count > 0, "release_pool: private pool (", id.first,
                ", ", id.second, ") is not held");
  return --pool->use_count;
}

bool PrivatePools::release_unused(bool all) {
  const bool released = segments_.release_free([&](const Segment& segment) {
    const PrivatePool* pool = segment.pool->id() == kSharedPoolId ? nullptr : find(segment.pool->id());
    return pool != nullptr && (all || pool->use_count == 0);
  });
  std::erase_if(pools_, [&](const auto& entry) {
    const PrivatePool& pool = *entry.second;
    const bool in_capture = std::any_of(captures_.begin(), captures_.end(),
                                        [&](const auto& capture) { return capture.first == &pool; });
    return pool.use_count == 0 && pool.segments == 0 && !in_capture;
  });
  return released;
}

std::vector<PrivatePool*> PrivatePools::lenders() const {
  std::vector<PrivatePool*> out;
  for (const auto& [id, pool] : pools_) {
    if (pool->use_on_oom) out.push_back(pool.get());
  }
  return out;
}

std::vector<const Pool*> PrivatePools::pools() const {
  std::vector<const Pool*> out;
  out.reserve(pools_.size());
  for (const auto& [id, pool] : pools_) out.push_back(pool.get());
  return out;
}

}  // namespace stowage
