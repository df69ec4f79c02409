// Blocks and segments: the caching allocator's bookkeeping of device memory.
//
// A segment is one piece of memory obtained from the backend; it is tiled, without gaps or
// overlap, by the blocks on its address-ordered list (first, then each block's next). A block is
// in one of three states:
//   - kAllocated: handed to a caller; in the allocator's address map;
//   - kPendingFree: freed by its caller, but streams recorded with record_stream may still use
//     it; it waits for their events and is in no index;
//   - kFree: cached; in exactly one free index (its pool's), keyed by (stream, size, address).
// Free blocks never touch each other: freeing coalesces with free neighbours.
//
// On the paged path (Note [Paged pool] in caching_allocator.hpp) a segment is an address
// reservation of which only some pages are mapped to physical memory. There a free block is
// either mapped (all its bytes lie on mapped pages: cached memory, in the pool's free index) or
// unmapped (page-aligned, every page unmapped: address space only, in the pool's hole index).
// Allocated and pending blocks always lie on mapped pages. Free neighbours coalesce only when
// both are mapped or both unmapped.
//
// Blocks carry intrusive hooks for both indexes (Boost.Intrusive), so indexing a block never
// allocates. They are plain data owned by the CachingAllocator (through its BlockArena) and
// guarded by its lock.
#pragma once

#include <boost/intrusive/set_hook.hpp>
#include <boost/intrusive/unordered_set_hook.hpp>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/device/backend.hpp"
#include "allocator/size_policy.hpp"

namespace stowage {

enum class BlockState : std::uint8_t { kFree, kAllocated, kPendingFree };

struct Segment;
struct PrivatePool;

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
  // Allocated blocks only: the StepLearner's record of the allocation (UINT64_MAX: none).
  std::uint64_t learned_record = UINT64_MAX;
  FreeHook free_hook;
  AddressHook address_hook;

  bool is_split() const noexcept { return prev != nullptr || next != nullptr; }
  void* pointer() const noexcept { return reinterpret_cast<void*>(address); }
};

struct Segment {
  std::uintptr_t base = 0;
  std::size_t size = 0;  // bytes; for a paged segment, of address space (mapped or not)
  Stream stream;
  Pool pool = Pool::kSmall;
  Block* first = nullptr;    // the lowest block; the list tiles [base, base + size)
  std::uint64_t context = 0;  // caller's stack handle when the segment was created
  // The private pool the segment belongs to (Note [Private pools]); nullptr: the shared pools.
  // A private pool's segments are never paged.
  PrivatePool* owner = nullptr;
  // Paged segments only: the physical handle mapped at each page (0: unmapped), up to the
  // highest page mapped so far (pages past the end are unmapped).
  bool paged = false;
  std::vector<std::uint64_t> pages;
  std::size_t mapped_pages = 0;
  // The arena of a placement plan (Note [Learned placement]): a paged segment whose free blocks
  // are kept apart, by address, for the plan's allocations.
  bool planned = false;

  // Wholly free: one block spanning the segment, and it is free.
  bool is_free() const noexcept {
    return first != nullptr && first->next == nullptr && first->state == BlockState::kFree;
  }
};

}  // namespace stowage
