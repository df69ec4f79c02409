// Blocks and segments: how a block cache (block_cache.hpp) keeps track of memory.
//
// A segment is one piece of memory obtained from a memory source (memory_source.hpp); it is
// tiled, without gaps or overlap, by the blocks on its address-ordered list (first, then each
// block's next). A block is in one of three states:
//   - kAllocated: handed to a caller; in the cache's address map;
//   - kPendingFree: freed by its caller, but streams recorded with record_stream may still use
//     it; it waits for their events and is in no index;
//   - kFree: cached; in exactly one index of its segment's pool (pool.hpp).
// Free blocks never touch each other: freeing coalesces with free neighbours.
//
// A segment of paged memory (paged_memory.hpp) is an address reservation of which only some
// pages are mapped to physical memory; its page table says which. There a free block is either
// mapped (all its bytes lie on mapped pages: cached memory) or unmapped (page-aligned, every page
// unmapped: address space only, a "hole"). Allocated and pending blocks always lie on mapped
// pages. Free neighbours coalesce only when both are mapped or both unmapped. A whole segment
// (segment_source.hpp) has no page table and only mapped blocks.
//
// Blocks carry intrusive hooks for both indexes (Boost.Intrusive), so indexing a block never
// allocates. Blocks, segments and page tables are plain data owned by the parts of one
// allocator (blocks and segments by its BlockCache, page tables by its PagedMemory) and guarded
// by its lock.
#pragma once

#include <boost/intrusive/set_hook.hpp>
#include <boost/intrusive/unordered_set_hook.hpp>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/size_policy.hpp"
#include "device/backend.hpp"

namespace stowage {

enum class BlockState : std::uint8_t { kFree, kAllocated, kPendingFree };

struct Segment;
class Pool;

struct Block {
  using FreeHook = boost::intrusive::set_member_hook<
      boost::intrusive::link_mode<boost::intrusive::normal_link>>;
  using AddressHook = boost::intrusive::unordered_set_member_hook<
      boost::intrusive::link_mode<boost::intrusive::normal_link>>;

  std::uintptr_t address = 0;
  std::size_t size = 0;       // bytes the block spans (a multiple of 512)
  std::size_t requested = 0;  // bytes the caller asked for; 0 unless allocated or pending
  Stream stream;              // the stream of its segment
  Segment* segment = nullptr;
  Block* prev = nullptr;  // address-ordered neighbours within the segment
  Block* next = nullptr;
  BlockState state = BlockState::kFree;
  bool oversize = false;            // allocated for a request of max_split_size or more
  bool mapped = true;               // false only for a free block over unmapped pages
  std::uint32_t pending_events = 0;  // events still to complete before a pending block is free
  std::uint64_t context = 0;        // caller's stack handle at allocation (0: none)
  std::vector<Stream> stream_uses;  // other streams recorded with record_stream
  FreeHook free_hook;
  AddressHook address_hook;

  bool is_split() const noexcept { return prev != nullptr || next != nullptr; }
  void* pointer() const noexcept { return reinterpret_cast<void*>(address); }
};

// The physical pages of one address reservation: the handle mapped at each page (0: unmapped),
// up to the highest page mapped so far (pages past the end are unmapped).
struct PageTable {
  std::size_t page_bytes = 0;
  std::vector<std::uint64_t> handles;
  std::size_t mapped = 0;  // handles that are not 0
};

struct Segment {
  std::uintptr_t base = 0;
  std::size_t size = 0;  // bytes; for paged memory, of address space (mapped or not)
  Stream stream;
  SizeClass size_class = SizeClass::kSmall;
  Block* first = nullptr;     // the lowest block; the list tiles [base, base + size)
  std::uint64_t context = 0;  // caller's stack handle when the segment was created
  Pool* pool = nullptr;       // whose indexes its free blocks go to
  PageTable* pages = nullptr;  // paged memory's page table; nullptr for a whole segment

  // Wholly free: one block spanning the segment, and it is free.
  bool is_free() const noexcept {
    return first != nullptr && first->next == nullptr && first->state == BlockState::kFree;
  }
  // The device memory it holds: its mapped pages, or all of it.
  std::size_t reserved_bytes() const noexcept {
    return pages != nullptr ? pages->mapped * pages->page_bytes : size;
  }
};

}  // namespace stowage
