// The free blocks of one pool, ordered for best fit (Note [Best fit]).
//
// Note [Best fit]
// Free blocks are ordered by (stream, size, address). The best fit for a request on stream s of
// n bytes is the first block at or after (s, n, 0): the smallest block of that stream that is
// large enough, and among equals the lowest address, which packs live blocks towards segment
// starts and leaves the tails of segments free to coalesce. Blocks of other streams are never
// returned: reusing another stream's block without synchronising would race with work still
// queued on that stream.
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
  void insert(Block& block) { set_.insert(block); }
  void erase(Block& block) { set_.erase(set_.iterator_to(block)); }

  // The smallest free block of `stream` holding at least `bytes`, lowest address on ties, or
  // nullptr.
  Block* best_fit(Stream stream, std::size_t bytes) {
    const auto it = set_.lower_bound(Key{stream.handle, bytes, 0}, KeyCompare{});
    if (it == set_.end() || it->stream.handle != stream.handle) return nullptr;
    return &*it;
  }

  // The largest free block of `stream` (highest address on ties), or nullptr.
  Block* largest(Stream stream) {
    auto it = set_.upper_bound(Key{stream.handle, SIZE_MAX, UINTPTR_MAX}, KeyCompare{});
    if (it == set_.begin()) return nullptr;
    --it;
    return it->stream.handle == stream.handle ? &*it : nullptr;
  }

  // Calls fn(block) for the blocks of `stream` holding at least `bytes`, smallest first, while
  // fn returns true. fn must not change the index.
  template <typename Fn>
  void for_each_fitting(Stream stream, std::size_t bytes, Fn&& fn) {
    for (auto it = set_.lower_bound(Key{stream.handle, bytes, 0}, KeyCompare{});
         it != set_.end() && it->stream.handle == stream.handle; ++it) {
      if (!fn(*it)) return;
    }
  }

  // Calls fn(block) for the blocks of `stream` holding at least `bytes`, largest first, while
  // fn returns true. fn must not change the index.
  template <typename Fn>
  void for_each_fitting_largest_first(Stream stream, std::size_t bytes, Fn&& fn) {
    auto it = set_.upper_bound(Key{stream.handle, SIZE_MAX, UINTPTR_MAX}, KeyCompare{});
    while (it != set_.begin()) {
      --it;
      if (it->stream.handle != stream.handle || it->size < bytes) return;
      if (!fn(*it)) return;
    }
  }

  std::size_t size() const noexcept { return set_.size(); }
  bool empty() const noexcept { return set_.empty(); }

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
  static Key key_of(const Block& block) { return {block.stream.handle, block.size, block.address}; }
  static bool less(const Key& a, const Key& b) {
    return std::tie(a.stream, a.size, a.address) < std::tie(b.stream, b.size, b.address);
  }
  struct BlockCompare {
    bool operator()(const Block& a, const Block& b) const { return less(key_of(a), key_of(b)); }
  };
  struct KeyCompare {
    bool operator()(const Key& a, const Block& b) const { return less(a, key_of(b)); }
    bool operator()(const Block& a, const Key& b) const { return less(key_of(a), b); }
  };

  boost::intrusive::multiset<
      Block, boost::intrusive::member_hook<Block, Block::FreeHook, &Block::free_hook>,
      boost::intrusive::compare<BlockCompare>, boost::intrusive::constant_time_size<true>>
      set_;
};

}  // namespace stowage
