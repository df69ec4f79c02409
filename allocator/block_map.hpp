// Pointer-to-block lookup for allocated blocks, O(1).
//
// An intrusive hash set (Boost.Intrusive) keyed by the block's address: inserting and erasing
// never allocate; the bucket array doubles when the set outgrows it, so allocation happens
// O(log n) times in the map's life, not per block.
//
// Contract: not thread-safe (the allocator's lock guards it); does not own the blocks.
#pragma once

#include <boost/intrusive/unordered_set.hpp>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/block.hpp"

namespace stowage {

class BlockMap {
 public:
  BlockMap() : buckets_(kInitialBuckets), set_(BucketTraits(buckets_.data(), buckets_.size())) {}
  BlockMap(const BlockMap&) = delete;
  BlockMap& operator=(const BlockMap&) = delete;
  ~BlockMap() { set_.clear(); }

  void insert(Block& block) {
    if (set_.size() >= buckets_.size()) grow();
    set_.insert(block);
  }
  void erase(Block& block) { set_.erase(set_.iterator_to(block)); }

  Block* find(std::uintptr_t address) {
    const auto it = set_.find(address, AddressHash{}, AddressEqual{});
    return it == set_.end() ? nullptr : &*it;
  }

  const Block* find(std::uintptr_t address) const {
    const auto it = set_.find(address, AddressHash{}, AddressEqual{});
    return it == set_.end() ? nullptr : &*it;
  }

  std::size_t size() const noexcept { return set_.size(); }

 private:
  static constexpr std::size_t kInitialBuckets = 1024;

  struct AddressHash {
    // The buckets are picked by the hash's low bits, and block addresses share many low bits
    // (large blocks are often 2 MiB aligned), so every bit is mixed into them (splitmix64's
    // finaliser); a plain multiply would leave the low bits of aligned addresses zero.
    std::size_t operator()(std::uintptr_t address) const noexcept {
      std::uint64_t x = address;
      x ^= x >> 30;
      x *= 0xBF58476D1CE4E5B9ull;
      x ^= x >> 27;
      x *= 0x94D049BB133111EBull;
      x ^= x >> 31;
      return static_cast<std::size_t>(x);
    }
    std::size_t operator()(const Block& block) const noexcept { return (*this)(block.address); }
  };
  struct AddressEqual {
    bool operator()(std::uintptr_t a, const Block& b) const noexcept { return a == b.address; }
    bool operator()(const Block& a, std::uintptr_t b) const noexcept { return a.address == b; }
    bool operator()(const Block& a, const Block& b) const noexcept { return a.address == b.address; }
  };

  using Set = boost::intrusive::unordered_set<
      Block, boost::intrusive::member_hook<Block, Block::AddressHook, &Block::address_hook>,
      boost::intrusive::hash<AddressHash>, boost::intrusive::equal<AddressEqual>,
      boost::intrusive::power_2_buckets<true>, boost::intrusive::constant_time_size<true>>;
  using BucketTraits = Set::bucket_traits;
  using Bucket = Set::bucket_type;

  void grow() {
    std::vector<Bucket> bigger(buckets_.size() * 2);
    set_.rehash(BucketTraits(bigger.data(), bigger.size()));
    buckets_.swap(bigger);
  }

  std::vector<Bucket> buckets_;
  Set set_;
};

}  // namespace stowage
