// BlockCache: the stream-ordered block cache. It keeps the segments a memory source obtained,
// tiled by blocks, hands blocks out, and takes them back for reuse only once the work that used
// them is done.
//
// What it does: block lists (block.hpp), splitting a block and coalescing free neighbours, the
// pools' indexes of free blocks (pool.hpp; which pool a segment belongs to, and so which index a
// free block goes to, is the segment's), the address map of allocated blocks, the statistics of
// blocks (allocation, allocated, requested, active, inactive split; stats.hpp) and their trace
// events (alloc, free_requested, free_completed). What it does not: decide which block serves a
// request, where memory comes from, or when memory goes back (that is the memory sources' and
// the allocator's); it calls the device only for events (and, when recording one fails, to wait
// for a stream instead).
//
// Note [Stream-ordered reuse]
// A block is reusable on its own stream as soon as it is freed, because work on one stream runs
// in order. record_stream(block, s) says another stream s uses the block too; then the free
// records an event on s and the block stays pending until the event completes. Completed events
// are found by querying (process_events), never by waiting, so the hot path does not block; a
// caller that must have the memory waits with synchronize_pending. While a CUDA graph is being
// captured no event may be recorded: defer_free keeps such a block pending until flush_deferred.
// If recording an event fails, the block's streams are waited for instead; if that fails too,
// the block stays pending for good rather than be handed out while a stream may use it.
//
// Serves the caching allocator (over device memory), and is made to serve the offload engine's
// pinned host pool (over host memory) the same way, each with its own cache.
//
// Contract: not thread-safe (the owner's lock guards every call). Owns its blocks and segments
// (not the memory under them, which the memory sources own). The Listener hears of each block
// that becomes free, under the owner's lock; it may change the cache.
// Invariant (check_invariants), per size class and in total:
//   reserved_bytes == allocated_bytes + pending-free bytes + free (cached) bytes
// and active_bytes == allocated_bytes + pending-free bytes; blocks tile each segment exactly;
// the pools' indexes hold exactly the free blocks, the address map exactly the allocated ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "allocator/block.hpp"
#include "allocator/block_map.hpp"
#include "allocator/block_store.hpp"
#include "allocator/pool.hpp"
#include "allocator/stats.hpp"
#include "allocator/trace_recorder.hpp"
#include "device/backend.hpp"

namespace stowage {

class BlockCache {
 public:
  class Listener {
   public:
    // `block` has just become free (after coalescing, indexed in its pool).
    virtual void block_freed(Block& block) = 0;

   protected:
    ~Listener() = default;
  };

  // `backend` gives the events of Note [Stream-ordered reuse]; `stats` and `trace` are the
  // owner's, written under its lock.
  BlockCache(DeviceBackend& backend, DeviceStats& stats, TraceRecorder& trace,
             Listener* listener = nullptr);
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // --- segments ---
  // Records a segment of `pool` over [base, base + size) and the one free block spanning it
  // (unmapped when `pages` is given), not yet indexed; throws with nothing recorded on failure.
  Block* add_segment(std::uintptr_t base, std::size_t size, Stream stream, SizeClass size_class,
                     std::uint64_t context, Pool& pool, PageTable* pages = nullptr);
  // Forgets a wholly free segment whose block is out of every index (the memory is the caller's
  // to give back).
  void remove_segment(Segment& segment) noexcept;
  // By base address.
  std::map<std::uintptr_t, Segment>& segments() noexcept { return segments_; }
  const std::map<std::uintptr_t, Segment>& segments() const noexcept { return segments_; }

  // --- free blocks ---
  // A spare block record, for the caller to link with split_after; may throw std::bad_alloc.
  Block* acquire_block() { return store_.acquire(); }
  void recycle_block(Block* block) noexcept { store_.recycle(block); }
  // Cuts `block` after its first `keep` bytes (0 < keep < size); the rest goes to `rest`, a
  // spare record, linked after it with the same stream, segment and mapping. Neither is indexed
  // or counted here.
  static void split_after(Block* block, std::size_t keep, Block* rest) noexcept;
  // Puts a free block in its pool's index / takes it out, counting inactive splits.
  void index(Block& block);
  void unindex(Block& block);
  // Indexes a free, unindexed block after coalescing it with free neighbours of the same kind
  // (mapped or unmapped); returns the coalesced block.
  Block* insert_free(Block* block);

  // --- allocation ---
  // Hands out a free, unindexed block for a request of `bytes` (`rounded` after rounding): when
  // `split` is set, the part beyond `rounded` becomes a free block of its own (unless no record
  // can be had for it).
  void claim(Block* block, std::size_t bytes, std::size_t rounded, bool split, bool oversize,
             std::uint64_t context);
  // Marks a free, unindexed block allocated for `bytes` and counts it.
  void mark_allocated(Block* block, std::size_t bytes, bool oversize, std::uint64_t context);
  Block* find_allocated(std::uintptr_t address) noexcept { return allocated_.find(address); }
  const Block* find_allocated(std::uintptr_t address) const noexcept {
    return allocated_.find(address);
  }
  std::size_t allocated_blocks() const noexcept { return allocated_.size(); }
  // The most active bytes there ever were (not reset with the statistics).
  std::size_t active_high_water() const noexcept { return active_high_water_; }
  std::size_t active_bytes() const noexcept {
    return static_cast<std::size_t>(stats_.active_bytes.all().current);
  }

  // --- freeing (Note [Stream-ordered reuse]) ---
  // `stream` uses the allocated block too.
  static void record_stream(Block& block, Stream stream);
  // Takes an allocated block out of the address map and the allocation counts; the block is
  // then the caller's to pass to free_after_streams or defer_free.
  void end_allocation(Block* block, std::uint64_t context);
  // Frees the block now, or once events on its other streams complete.
  void free_after_streams(Block* block);
  // Keeps the block pending, with no event recorded, until flush_deferred.
  void defer_free(Block* block);
  void flush_deferred();
  // Frees the pending blocks whose events have completed; never waits.
  void process_events();
  // Waits for every pending block's events, then frees them.
  void synchronize_pending();
  bool has_pending_events() const noexcept { return !pending_events_.empty(); }
  // Frees an allocated-then-ended or pending block now, whatever its streams. The block may be
  // coalesced away (and its segment released by the listener): do not use it afterwards.
  void free_block(Block* block);

  // Throws InternalError if an invariant above is broken, for the blocks of `pools` (every pool
  // that holds segments). O(blocks).
  void check_invariants(const std::vector<const Pool*>& pools) const;

 private:
  struct PendingEvent {
    Event event;
    Block* block;
  };
  struct Sums;

  // Adds (sign +1) or removes (-1) a free block's contribution to the inactive_split stats.
  void count_inactive_split(const Block& block, int sign);
  Event acquire_event();
  void check_segment(const Segment& segment, Sums& sums, std::size_t& free_blocks,
                     std::size_t& allocated_blocks) const;
  void check_indexes(const std::vector<const Pool*>& pools, std::size_t free_blocks) const;
  void check_stats(const Sums (&sums)[kSizeClasses]) const;

  DeviceBackend& backend_;
  DeviceStats& stats_;
  TraceRecorder& trace_;
  Listener* listener_;
  BlockStore store_;
  std::map<std::uintptr_t, Segment> segments_;
  BlockMap allocated_;
  std::size_t active_high_water_ = 0;
  std::vector<PendingEvent> pending_events_;
  std::vector<Block*> deferred_frees_;  // pending blocks whose events wait for captures to end
  std::vector<Event> spare_events_;
};

}  // namespace stowage
