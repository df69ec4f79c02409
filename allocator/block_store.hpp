// Storage for Block objects: slabs with a free list, so creating a block on the hot path (a
// split) takes one from the list instead of calling the heap.
//
// Contract: not thread-safe (the allocator's lock guards it). Owns every Block it hands out;
// they stay valid until recycled or until the store is destroyed. A recycled block comes back
// value-initialised except for the capacity of its stream_uses vector.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "allocator/block.hpp"

namespace stowage {

class BlockStore {
 public:
  Block* acquire() {
    if (free_ == nullptr) grow();
    Block* block = free_;
    free_ = block->next;
    block->next = nullptr;
    ++live_;
    return block;
  }

  void recycle(Block* block) noexcept {
    std::vector<Stream> uses = std::move(block->stream_uses);
    uses.clear();
    block->~Block();
    new (block) Block();
    block->stream_uses = std::move(uses);
    block->next = free_;
    free_ = block;
    --live_;
  }

  std::size_t live() const noexcept { return live_; }

 private:
  static constexpr std::size_t kSlabBlocks = 256;

  void grow() {
    slabs_.push_back(std::make_unique<Block[]>(kSlabBlocks));
    Block* slab = slabs_.back().get();
    for (std::size_t i = kSlabBlocks; i-- > 0;) {
      slab[i].next = free_;
      free_ = &slab[i];
    }
  }

  std::vector<std::unique_ptr<Block[]>> slabs_;
  Block* free_ = nullptr;  // chained through Block::next
  std::size_t live_ = 0;
};

}  // namespace stowage
