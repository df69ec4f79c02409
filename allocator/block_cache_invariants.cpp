// BlockCache::check_invariants: the identities of block_cache.hpp, checked by walking every
// segment's blocks and every pool's indexes.
#include <algorithm>

#include "allocator/block_cache.hpp"
#include "base/errors.hpp"
#include "base/numbers.hpp"

namespace stowage {

struct BlockCache::Sums {
  std::int64_t reserved = 0, allocated = 0, pending = 0, free = 0, requested = 0;
  std::int64_t segments = 0, allocations = 0, active = 0, inactive_split = 0;
  std::int64_t inactive_split_bytes = 0;
};

namespace {

// Paged memory: holes are page-aligned, unmapped and free; every other block lies on mapped
// pages. Returns the distinct pages under mapped blocks, counted once even where two blocks
// share one (`last_counted` carries the last page counted from block to block).
std::size_t check_pages_under(const Segment& segment, const Block& block,
                              std::size_t& last_counted) {
  const std::size_t page = segment.pages->page_bytes;
  if (!block.mapped) {
    STOWAGE_INTERNAL_ASSERT(block.state == BlockState::kFree &&
                                (block.address - segment.base) % page == 0 &&
                                block.size % page == 0,
                            "hole ", block.address, " is not free whole pages");
    return 0;
  }
  std::size_t counted = 0;
  const std::size_t first = (block.address - segment.base) / page;
  const std::size_t last = (block.address + block.size - segment.base - 1) / page;
  for (std::size_t index = first; index <= last; ++index) {
    STOWAGE_INTERNAL_ASSERT(
        index < segment.pages->handles.size() && segment.pages->handles[index] != 0, "block ",
        block.address, " lies on unmapped page ", index, " of segment ", segment.base);
    if (index != last_counted) ++counted;
    last_counted = index;
  }
  return counted;
}

void check_page_table(const Segment& segment) {
  const PageTable& table = *segment.pages;
  STOWAGE_INTERNAL_ASSERT(table.page_bytes > 0 && segment.size % table.page_bytes == 0 &&
                          table.handles.size() <= segment.size / table.page_bytes);
  const auto mapped = static_cast<std::size_t>(
      std::count_if(table.handles.begin(), table.handles.end(),
                    [](std::uint64_t handle) { return handle != 0; }));
  STOWAGE_INTERNAL_ASSERT(mapped == table.mapped, "segment ", segment.base, " counts ",
                          table.mapped, " mapped pages wrongly");
}

}  // namespace

void BlockCache::check_segment(const Segment& segment, Sums& sum, std::size_t& free_blocks,
                               std::size_t& allocated_blocks) const {
  const std::uintptr_t base = segment.base;
  STOWAGE_INTERNAL_ASSERT(segment.first != nullptr && segment.pool != nullptr);
  STOWAGE_INTERNAL_ASSERT(segment.first->prev == nullptr && segment.first->address == base,
                          "segment ", base, " does not start with its first block");
  sum.reserved += as_signed(segment.reserved_bytes());
  ++sum.segments;
  if (segment.pages != nullptr) check_page_table(segment);
  std::size_t pages_under_blocks = 0;
  std::size_t last_counted_page = SIZE_MAX;
  std::uintptr_t expected = base;
  const Block* prev = nullptr;
  for (const Block* block = segment.first; block != nullptr; block = block->next) {
    if (segment.pages != nullptr) {
      pages_under_blocks += check_pages_under(segment, *block, last_counted_page);
    } else {
      STOWAGE_INTERNAL_ASSERT(block->mapped, "an unmapped block in segment ", base);
    }
    STOWAGE_INTERNAL_ASSERT(block->segment == &segment && block->prev == prev,
                            "broken block list in segment ", base);
    STOWAGE_INTERNAL_ASSERT(block->address == expected, "gap or overlap at ", block->address,
                            " in segment ", base, " (expected ", expected, ")");
    STOWAGE_INTERNAL_ASSERT(block->size > 0 && block->size % SizePolicy::kMinBlockSize == 0);
    STOWAGE_INTERNAL_ASSERT(block->stream == segment.stream);
    switch (block->state) {
      case BlockState::kFree:
        STOWAGE_INTERNAL_ASSERT(
            prev == nullptr || prev->state != BlockState::kFree || prev->mapped != block->mapped,
            "free neighbours not coalesced at ", block->address);
        ++free_blocks;
        if (!block->mapped) break;
        sum.free += as_signed(block->size);
        if (block->is_split()) {
          ++sum.inactive_split;
          sum.inactive_split_bytes += as_signed(block->size);
        }
        break;
      case BlockState::kAllocated:
        STOWAGE_INTERNAL_ASSERT(allocated_.find(block->address) == block, "allocated block ",
                                block->address, " missing from the map");
        sum.allocated += as_signed(block->size);
        sum.requested += as_signed(block->requested);
        ++sum.allocations;
        ++sum.active;
        ++allocated_blocks;
        break;
      case BlockState::kPendingFree:
        sum.pending += as_signed(block->size);
        ++sum.active;
        break;
    }
    expected += block->size;
    prev = block;
  }
  STOWAGE_INTERNAL_ASSERT(expected == base + segment.size, "blocks of segment ", base,
                          " do not reach its end");
  if (segment.pages != nullptr) {
    STOWAGE_INTERNAL_ASSERT(pages_under_blocks == segment.pages->mapped, "segment ", base,
                            " has ", segment.pages->mapped, " mapped pages but blocks lie on ",
                            pages_under_blocks);
  }
}

void BlockCache::check_indexes(const std::vector<const Pool*>& pools,
                               std::size_t free_blocks) const {
  std::size_t indexed = 0;
  for (const Pool* pool : pools) {
    indexed += pool->free_blocks();
    const auto owned = static_cast<std::size_t>(
        std::count_if(segments_.begin(), segments_.end(),
                      [&](const auto& entry) { return entry.second.pool == pool; }));
    STOWAGE_INTERNAL_ASSERT(owned == pool->segments, "pool (", pool->id().first, ", ",
                            pool->id().second, ") counts ", pool->segments, " segments but owns ",
                            owned);
    for (const SizeClass size_class : {SizeClass::kSmall, SizeClass::kLarge}) {
      const bool by_address = pool->order() == Pool::Order::kAddress;
      pool->cached(size_class).for_each([&](const Block& block) {
        STOWAGE_INTERNAL_ASSERT(
            block.state == BlockState::kFree && block.segment->pool == pool &&
                (by_address || (block.mapped && block.segment->size_class == size_class)),
            "a pool's index of cached blocks holds a block it should not");
      });
      if (by_address) continue;  // one index holds them all
      pool->holes(size_class).for_each([&](const Block& block) {
        STOWAGE_INTERNAL_ASSERT(block.state == BlockState::kFree && !block.mapped &&
                                    block.segment->pool == pool &&
                                    block.segment->size_class == size_class,
                                "a pool's index of holes holds a block it should not");
      });
    }
  }
  for (const auto& [base, segment] : segments_) {
    STOWAGE_INTERNAL_ASSERT(std::find(pools.begin(), pools.end(), segment.pool) != pools.end(),
                            "segment ", base, " belongs to a pool that was not checked");
  }
  STOWAGE_INTERNAL_ASSERT(free_blocks == indexed, "the free indexes hold ", indexed,
                          " blocks but ", free_blocks, " are free");
}

void BlockCache::check_stats(const Sums (&sums)[kSizeClasses]) const {
  for (const SizeClass size_class : {SizeClass::kSmall, SizeClass::kLarge}) {
    const Sums& sum = sums[index_of(size_class)];
    // The accounting identity: reserved == allocated + pending + free.
    STOWAGE_INTERNAL_ASSERT(sum.reserved == sum.allocated + sum.pending + sum.free);
    STOWAGE_INTERNAL_ASSERT(stats_.reserved_bytes.of(size_class).current == sum.reserved,
                            "reserved_bytes ", stats_.reserved_bytes.of(size_class).current,
                            " != ", sum.reserved);
    STOWAGE_INTERNAL_ASSERT(stats_.allocated_bytes.of(size_class).current == sum.allocated,
                            "allocated_bytes ", stats_.allocated_bytes.of(size_class).current,
                            " != ", sum.allocated);
    STOWAGE_INTERNAL_ASSERT(stats_.active_bytes.of(size_class).current ==
                            sum.allocated + sum.pending);
    STOWAGE_INTERNAL_ASSERT(stats_.requested_bytes.of(size_class).current == sum.requested);
    STOWAGE_INTERNAL_ASSERT(stats_.segment.of(size_class).current == sum.segments);
    STOWAGE_INTERNAL_ASSERT(stats_.allocation.of(size_class).current == sum.allocations);
    STOWAGE_INTERNAL_ASSERT(stats_.active.of(size_class).current == sum.active);
    STOWAGE_INTERNAL_ASSERT(stats_.inactive_split.of(size_class).current == sum.inactive_split,
                            "inactive_split ", stats_.inactive_split.of(size_class).current,
                            " != ", sum.inactive_split);
    STOWAGE_INTERNAL_ASSERT(stats_.inactive_split_bytes.of(size_class).current ==
                            sum.inactive_split_bytes);
  }
  std::size_t mapped_pages = 0;
  for (const auto& [base, segment] : segments_) {
    if (segment.pages != nullptr) mapped_pages += segment.pages->mapped;
  }
  STOWAGE_INTERNAL_ASSERT(stats_.mapped_pages.current == as_signed(mapped_pages),
                          "mapped_pages ", stats_.mapped_pages.current, " != ", mapped_pages);
  for (const SizeClassStats* by_class :
       {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
        &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
        &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
    STOWAGE_INTERNAL_ASSERT(by_class->stats[0].current ==
                            by_class->stats[1].current + by_class->stats[2].current);
  }
}

void BlockCache::check_invariants(const std::vector<const Pool*>& pools) const {
  Sums sums[kSizeClasses];
  std::size_t free_blocks = 0;
  std::size_t allocated_blocks = 0;
  std::size_t blocks = 0;
  for (const auto& [base, segment] : segments_) {
    STOWAGE_INTERNAL_ASSERT(base == segment.base);
    check_segment(segment, sums[index_of(segment.size_class)], free_blocks, allocated_blocks);
    for (const Block* block = segment.first; block != nullptr; block = block->next) ++blocks;
  }
  STOWAGE_INTERNAL_ASSERT(blocks == store_.live(), "the store holds ", store_.live(),
                          " blocks but segments hold ", blocks);
  STOWAGE_INTERNAL_ASSERT(allocated_blocks == allocated_.size(), "the address map holds ",
                          allocated_.size(), " blocks but ", allocated_blocks, " are allocated");
  check_indexes(pools, free_blocks);
  check_stats(sums);
  for (const Block* block : deferred_frees_) {
    STOWAGE_INTERNAL_ASSERT(block->state == BlockState::kPendingFree && block->pending_events == 0);
  }
  for (const PendingEvent& pending : pending_events_) {
    STOWAGE_INTERNAL_ASSERT(pending.block->state == BlockState::kPendingFree &&
                            pending.block->pending_events > 0);
  }
}

}  // namespace stowage
