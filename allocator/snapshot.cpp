#include "allocator/snapshot.hpp"

namespace stowage {

void append_snapshot(const Segment& segment, AllocatorSnapshot& out) {
  SegmentSnapshot* shot = nullptr;
  for (const Block* block = segment.first; block != nullptr; block = block->next) {
    if (!block->mapped) {
      shot = nullptr;
      continue;
    }
    if (shot == nullptr) {
      shot = &out.segments.emplace_back();
      shot->address = block->address;
      shot->stream = segment.stream;
      shot->size_class = segment.size_class;
      shot->context = segment.context;
      shot->is_expandable = segment.pages != nullptr;
      shot->owner = segment.pool->id();
    }
    shot->total_size += block->size;
    shot->blocks.push_back(
        {block->address, block->size, block->requested, block->state, block->context});
    if (block->state != BlockState::kFree) shot->active_size += block->size;
    if (block->state == BlockState::kAllocated) {
      shot->allocated_size += block->size;
      shot->requested_size += block->requested;
    }
  }
}

std::pair<void*, std::size_t> mapped_range(const Block& block) {
  const Block* first = &block;
  while (first->prev != nullptr && first->prev->mapped) first = first->prev;
  std::size_t bytes = 0;
  for (const Block* b = first; b != nullptr && b->mapped; b = b->next) bytes += b->size;
  return {first->pointer(), bytes};
}

}  // namespace stowage
