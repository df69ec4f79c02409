// PrivatePools: the private pools of one allocator, and which requests go to them.
//
// Note [Private pools]
// A private pool sets memory apart for one owner: a CUDA graph being captured (its replays reuse
// the addresses it captured, so no one else may take them), or a torch MemPool. Between
// begin_allocate(id, filter) and end_allocate(id), requests on streams the filter accepts are
// served from pool `id` alone: its own free blocks, else a new segment that belongs to it
// (private pools use the segment source, never paged memory, so their memory never moves). Their
// blocks, once freed, go back to that pool's indexes only. Holders share a pool through its use
// count (create_or_incref, release); when it reaches zero the pool's wholly free segments go
// back to the device, and the rest follow as their blocks are freed. While requests are routed
// to any private pool (capturing(): a CUDA graph capture, or torch's use_mem_pool, which torch
// routes the same way and its own allocator treats alike) the allocator makes no call a capture
// forbids: it neither queries nor waits for events (frees that need events wait until the
// routing ends), nor synchronises to move pages, nor calls the pressure handlers; a miss it
// cannot serve without those is an OutOfMemory, and empty_cache is refused. A pool's layout can be saved and restored
// (pool_checkpoint.hpp: torch's cudagraph trees).
//
// Contract: not thread-safe (the allocator's lock guards it); stream filters are called under
// it. Owns the pools; their segments are the BlockCache's, given back through the SegmentSource.
// Throws LogicError naming the pool for a pool that does not exist or is not held.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "allocator/pool.hpp"
#include "allocator/segment_source.hpp"

namespace stowage {

class PrivatePools {
 public:
  using StreamFilter = std::function<bool(Stream)>;

  explicit PrivatePools(SegmentSource& segments) : segments_(segments) {}

  // Whether requests are being routed to a private pool (a capture or a MemPool is under way);
  // the allocator then behaves as under a capture (Note [Private pools]).
  bool capturing() const noexcept { return !captures_.empty(); }
  // The pool requests on `stream` go to now, or nullptr.
  PrivatePool* capture_pool(Stream stream) const;
  // Pool `id`, or nullptr.
  PrivatePool* find(PoolId id) const;
  // Pool `id`; throws when it does not exist (`what` names the caller).
  PrivatePool& get(PoolId id, const char* what) const;
  PrivatePool& create_or_incref(PoolId id);
  void begin_allocate(PoolId id, StreamFilter filter);
  void end_allocate(PoolId id);
  // Drops a holder of a held pool; returns the holders left.
  int release(PoolId id);
  // Returns the wholly free segments of pools nobody holds (of every pool with `all`) and forgets
  // pools left empty; true if any segment went back.
  bool release_unused(bool all);
  // The pools whose free blocks may serve others' requests rather than an OOM.
  std::vector<PrivatePool*> lenders() const;
  std::vector<const Pool*> pools() const;

 private:
  SegmentSource& segments_;
  std::map<PoolId, std::unique_ptr<PrivatePool>> pools_;
  std::vector<std::pair<PrivatePool*, StreamFilter>> captures_;  // pools being allocated to
};

}  // namespace stowage
