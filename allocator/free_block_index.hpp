// One index of a pool's free blocks (pool.hpp), ordered for best fit (Note [Best fit]).
//
// Note [Best fit]
// Free blocks are ordered by (stream, size, address). The best fit for a request on stream s of
// n bytes is the first block at or after (s, n, 0): the smallest block of that stream that is
// large enough, and among equals the lowest address, which packs live blocks towards segment
// starts and leaves the tails of segments free to coalesce. Blocks of other streams are never
// returned: reusing another stream's block without synchronising would race with work still
// queued on that stream.
//
// An index built with Order::kAddress orders its blocks by address alone, for placing blocks at
// chosen addresses (the arena of Note [Learned placement]): at_or_before() finds the free block
// at or below an address; best_fit() and largest() are for the default order only.
//
// Contract: not thread-safe (the allocator's lock guards it); does not own the blocks; a block
// is in at most one index. Insert, erase and lookup are O(log n) and never allocate.
#pragma once

#include <boost/intrusive/set.hpp>
#include <cstddef>
#include <cstdint>
#include <tuple>

#include "allocator/block.hpp"

namespace stowage {

class FreeBlockIndex {
 public:
  enum class Order : std::uint8_t { kBestFit, kAddress };

  explicit FreeBlockIndex(Order order = Order::kBestFit)
      : order_(order), set_(BlockCompare{order}) {}

  void insert(Block& block) { set_.insert(block); }
  void erase(Block& block) { set_.erase(set_.iterator_to(block)); }

  // The smallest free block of `stream` holding at least `bytes`, lowest address on ties, or
  // nullptr.
  Block* best_fit(Stream stream, std::size_t bytes) {
    const auto it = set_.lower_bound(Key{stream.handle, bytes, 0}, KeyCompare{order_});
    if (it == set_.end() || it->stream.handle != stream.handle) return nullptr;
    return &*it;
  }

  // The largest free block of `stream` (highest address on ties), or nullptr.
  Block* largest(Stream stream) {
    auto it = set_.upper_bound(Key{stream.handle, SIZE_MAX, UINTPTR_MAX}, KeyCompare{order_});
    if (it == set_.begin()) return nullptr;
    --it;
    return it->stream.handle == stream.handle ? &*it : nullptr;
  }

  // Calls fn(block) for the blocks of `stream` holding at least `bytes`, largest first, while
  // fn returns true. fn must not change the index.
  template <typename Fn>
  void for_each_fitting_largest_first(Stream stream, std::size_t bytes, Fn&& fn) {
    auto it = set_.upper_bound(Key{stream.handle, SIZE_MAX, UINTPTR_MAX}, KeyCompare{order_});
    while (it != set_.begin()) {
      --it;
      if (it->stream.handle != stream.handle || it->size < bytes) return;
      if (!fn(*it)) return;
    }
  }

  // Address order only: the free block with the highest address <= `address`, or nullptr.
  Block* at_or_before(std::uintptr_t address) {
    auto it = set_.upper_bound(Key{0, 0, address}, KeyCompare{order_});
    if (it == set_.begin()) return nullptr;
    return &*--it;
  }
  std::size_t size() const noexcept { return set_.size(); }

  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const Block& block : set_) fn(block);
  }

 private:
  struct Key {
    std::uintptr_t stream;
    std::size_t size;
    std::uintptr_t address;
  };
  static Key key_of(const Block& block, Order order) {
    if (order == Order::kAddress) return {0, 0, block.address};
    return {block.stream.handle, block.size, block.address};
  }
  static bool less(const Key& a, const Key& b) {
    return std::tie(a.stream, a.size, a.address) < std::tie(b.stream, b.size, b.address);
  }
  struct BlockCompare {
    Order order;
    bool operator()(const Block& a, const Block& b) const {
      return less(key_of(a, order), key_of(b, order));
    }
  };
  struct KeyCompare {
    Order order;
    bool operator()(const Key& a, const Block& b) const { return less(a, key_of(b, order)); }
    bool operator()(const Block& a, const Key& b) const { return less(key_of(a, order), b); }
  };

  Order order_;
  boost::intrusive::multiset<
      Block, boost::intrusive::member_hook<Block, Block::FreeHook, &Block::free_hook>,
      boost::intrusive::compare<BlockCompare>, boost::intrusive::constant_time_size<true>>
      set_;
};

}  // namespace stowage
