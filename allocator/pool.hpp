// Pools: sets of memory whose free blocks serve only the requests routed to them.
//
// Every segment belongs to one pool, and its free blocks go to that pool's indexes: cached
// blocks (mapped) and holes (unmapped address space, paged memory only), a pair of each per size
// class. An allocator has the shared pool, which serves every request by default; private pools
// (Note [Private pools] in private_pools.hpp), which serve one owner such as a CUDA graph or a
// torch MemPool; and, with learned placement, the arena (learned_placement.hpp), whose free
// blocks are kept apart for the layout's requests.
//
// Best-fit pools order each index by (stream, size, address) (Note [Best fit] in
// free_block_index.hpp). The arena instead keeps one index by address for all its free blocks,
// cached or not, of either class, to cut blocks out at laid-out addresses.
//
// Contract: plain data, not thread-safe (the allocator's lock guards it); does not own the
// blocks. Not copyable (its slots point into itself).
#pragma once

#include <array>
#include <cstddef>
#include <utility>

#include "allocator/block.hpp"
#include "allocator/free_block_index.hpp"
#include "allocator/size_policy.hpp"

namespace stowage {

// torch's MempoolId_t: (0, 0) names the shared pool; any other pair a private pool. The learned
// layout's arena also has the shared pool's id: to torch (snapshots, MemPool ids) its memory is the
// shared pool's, set apart by stowage for the layout, with indexes of its own.
using PoolId = std::pair<unsigned long long, unsigned long long>;  // NOLINT(google-runtime-int)
inline constexpr PoolId kSharedPoolId{0, 0};

class Pool {
 public:
  using Order = FreeBlockIndex::Order;

  explicit Pool(PoolId id = kSharedPoolId, Order order = Order::kBestFit)
      : id_(id),
        order_(order),
        indexes_{FreeBlockIndex(order), FreeBlockIndex(order), FreeBlockIndex(order),
                 FreeBlockIndex(order)} {
    for (std::size_t slot = 0; slot < kSlots; ++slot) {
      slots_[slot] = &indexes_[order == Order::kAddress ? 0 : slot];
    }
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() = default;

  PoolId id() const noexcept { return id_; }
  Order order() const noexcept { return order_; }

  FreeBlockIndex& cached(SizeClass size_class) noexcept { return *slots_[index_of(size_class)]; }
  const FreeBlockIndex& cached(SizeClass size_class) const noexcept {
    return *slots_[index_of(size_class)];
  }
  FreeBlockIndex& holes(SizeClass size_class) noexcept {
    return *slots_[kSizeClasses + index_of(size_class)];
  }
  const FreeBlockIndex& holes(SizeClass size_class) const noexcept {
    return *slots_[kSizeClasses + index_of(size_class)];
  }
  // The index a free block of this pool belongs in.
  FreeBlockIndex& index_for(const Block& block) noexcept {
    return block.mapped ? cached(block.segment->size_class) : holes(block.segment->size_class);
  }
  // Free blocks held, in all its indexes.
  std::size_t free_blocks() const noexcept {
    std::size_t held = 0;
    for (std::size_t slot = 0; slot < kSlots; ++slot) {
      if (slots_[slot] == &indexes_[slot]) held += indexes_[slot].size();
    }
    return held;
  }

  std::size_t segments = 0;  // segments it owns (kept by the BlockCache)
  bool no_split = false;     // its blocks are handed out whole, never cut

 private:
  static constexpr std::size_t kSlots = 2 * kSizeClasses;  // cached, then holes, per class

  PoolId id_;
  Order order_;
  std::array<FreeBlockIndex, kSlots> indexes_;
  std::array<FreeBlockIndex*, kSlots> slots_{};
};

// A private pool (Note [Private pools] in private_pools.hpp): a pool with holders. It lives while
// it has holders or segments.
class PrivatePool final : public Pool {
 public:
  explicit PrivatePool(PoolId id) : Pool(id) {}

  int use_count = 0;        // holders: graphs and MemPools that share it
  bool use_on_oom = false;  // its free blocks may serve others' requests rather than an OOM
};

}  // namespace stowage
