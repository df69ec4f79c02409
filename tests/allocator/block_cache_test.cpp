// The BlockCache on its own, as a memory source other than the caching allocator's (the pinned
// host pool, say) uses it: segments recorded by hand, blocks claimed from the pool's index,
// split, coalesced and reused in stream order, with the invariants checked after every step.
#include "allocator/block_cache.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "base/errors.hpp"
#include "base/numbers.hpp"
#include "device/host/host_backend.hpp"

namespace stowage {
namespace {

constexpr std::size_t kSegmentBytes = 4 << 20;

HostBackendOptions device(bool synchronous) {
  HostBackendOptions options;
  options.capacity_bytes = 64 << 20;
  options.synchronous = synchronous;
  return options;
}

// Records every block the cache reports free.
struct FreedBlocks final : BlockCache::Listener {
  void block_freed(Block& block) override { freed.push_back(block.address); }
  std::vector<std::uintptr_t> freed;
};

class BlockCacheTest : public ::testing::Test {
 protected:
  explicit BlockCacheTest(bool synchronous = true) : backend_(device(synchronous)) {}

  void TearDown() override {
    check();
    for (auto& [base, segment] : cache_.segments()) {
      ASSERT_TRUE(segment.is_free()) << "a test left a block allocated";
    }
  }

  void check() const { cache_.check_invariants({&pool_}); }

  // What a memory source does: a segment from the device, recorded, counted, indexed.
  Block* add_segment(Stream stream = {}) {
    void* memory = backend_.try_allocate_segment(kSegmentBytes);
    EXPECT_NE(memory, nullptr);
    Block* block = cache_.add_segment(reinterpret_cast<std::uintptr_t>(memory), kSegmentBytes,
                                      stream, SizeClass::kLarge, 0, pool_);
    stats_.segment.update(SizeClass::kLarge, 1);
    stats_.reserved_bytes.update(SizeClass::kLarge, as_signed(kSegmentBytes));
    cache_.index(*block);
    return block;
  }

  // Best fit from the pool, split at `bytes`.
  Block* allocate(std::size_t bytes, Stream stream = {}) {
    Block* block = pool_.cached(SizeClass::kLarge).best_fit(stream, bytes);
    if (block == nullptr) return nullptr;
    cache_.unindex(*block);
    cache_.claim(block, bytes, bytes, block->size - bytes >= SizePolicy::kMinBlockSize,
                 /*oversize=*/false, 0);
    return block;
  }

  void free(Block* block) {
    cache_.end_allocation(block, 0);
    cache_.free_after_streams(block);
  }

  HostBackend backend_;
  DeviceStats stats_;
  TraceRecorder trace_;
  FreedBlocks listener_;
  BlockCache cache_{backend_, stats_, trace_, &listener_};
  Pool pool_;
};

TEST_F(BlockCacheTest, SplitsOnClaimAndCoalescesOnFree) {
  add_segment();
  Block* a = allocate(1 << 20);
  Block* b = allocate(1 << 20);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->address, a->address + (1 << 20)) << "best fit packs towards the segment start";
  check();
  EXPECT_EQ(stats_.allocated_bytes.all().current, 2 << 20);
  EXPECT_EQ(stats_.inactive_split.all().current, 1) << "the tail is a split free block";
  free(a);
  check();
  EXPECT_EQ(pool_.free_blocks(), 2u) << "a is free but not next to the free tail";
  free(b);
  check();
  EXPECT_EQ(pool_.free_blocks(), 1u) << "all three pieces coalesced";
  EXPECT_TRUE(cache_.segments().begin()->second.is_free());
  EXPECT_EQ(listener_.freed.size(), 2u);
}

TEST_F(BlockCacheTest, AllocatedBlocksAreFoundByAddressUntilTheyEnd) {
  add_segment();
  Block* block = allocate(4096);
  ASSERT_NE(block, nullptr);  // GCC 13 warns of a possible null dereference otherwise
  EXPECT_EQ(cache_.find_allocated(block->address), block);
  EXPECT_EQ(cache_.allocated_blocks(), 1u);
  cache_.end_allocation(block, 0);
  EXPECT_EQ(cache_.find_allocated(block->address), nullptr);
  cache_.free_after_streams(block);
}

TEST_F(BlockCacheTest, TracksTheHighWaterOfActiveBytes) {
  add_segment();
  Block* a = allocate(2 << 20);
  free(a);
  Block* b = allocate(1 << 20);
  EXPECT_EQ(cache_.active_high_water(), std::size_t{2} << 20);
  EXPECT_EQ(cache_.active_bytes(), std::size_t{1} << 20);
  free(b);
}

TEST_F(BlockCacheTest, ABrokenCountIsCaught) {
  add_segment();
  stats_.allocated_bytes.update(SizeClass::kLarge, 512);
  EXPECT_THROW(check(), InternalError);
  stats_.allocated_bytes.update(SizeClass::kLarge, -512);
  check();
}

TEST_F(BlockCacheTest, ABlockInTheWrongIndexIsCaught) {
  Block* block = add_segment();
  Pool other;
  cache_.unindex(*block);
  other.cached(SizeClass::kLarge).insert(*block);
  EXPECT_THROW(cache_.check_invariants({&pool_, &other}), InternalError);
  other.cached(SizeClass::kLarge).erase(*block);
  cache_.index(*block);
}

// Stream-ordered reuse needs streams that run apart from the caller.
class BlockCacheStreamsTest : public BlockCacheTest {
 protected:
  BlockCacheStreamsTest() : BlockCacheTest(/*synchronous=*/false) {}
};

TEST_F(BlockCacheStreamsTest, ABlockUsedByAnotherStreamWaitsForIt) {
  add_segment();
  const Stream other = backend_.create_stream();
  Block* block = allocate(1 << 20);
  BlockCache::record_stream(*block, other);
  // The other stream is still busy with the block when its owner frees it.
  std::vector<char> host(1 << 20, 7);
  for (int i = 0; i < 16; ++i) backend_.copy_async(block->pointer(), host.data(), host.size(), other);
  free(block);
  EXPECT_EQ(block->state, BlockState::kPendingFree);
  EXPECT_TRUE(cache_.has_pending_events());
  check();
  cache_.synchronize_pending();
  EXPECT_FALSE(cache_.has_pending_events());
  EXPECT_EQ(stats_.num_sync_all_streams, 1);
  check();
  EXPECT_EQ(listener_.freed.size(), 1u);
  backend_.destroy_stream(other);
}

TEST_F(BlockCacheStreamsTest, DeferredFreesRecordTheirEventsWhenFlushed) {
  add_segment();
  const Stream other = backend_.create_stream();
  Block* block = allocate(1 << 20);
  BlockCache::record_stream(*block, other);
  cache_.end_allocation(block, 0);
  cache_.defer_free(block);
  EXPECT_FALSE(cache_.has_pending_events()) << "no event is recorded while deferred";
  check();
  cache_.flush_deferred();
  cache_.synchronize_pending();
  EXPECT_EQ(block->state, BlockState::kFree);
  backend_.destroy_stream(other);
}

// A random walk: blocks of random sizes on two streams, some used by the other stream too,
// freed in random order; each live block holds a pattern that must survive the others (the
// cheapest way to catch overlapping blocks), and the invariants hold after every step.
TEST_F(BlockCacheStreamsTest, RandomWalkKeepsBlocksApartAndTheInvariants) {
  const Stream streams[2] = {Stream{}, backend_.create_stream()};
  for (const Stream stream : streams) add_segment(stream);
  add_segment(streams[0]);
  std::mt19937_64 random(1234);
  std::map<Block*, unsigned char> live;
  for (int step = 0; step < 3000; ++step) {
    if (live.empty() || (live.size() < 24 && random() % 2 == 0)) {
      const Stream stream = streams[random() % 2];
      const std::size_t bytes = SizePolicy::block_size(1 + random() % (512 << 10));
      Block* block = allocate(bytes, stream);
      if (block == nullptr) {
        cache_.synchronize_pending();
        continue;
      }
      const auto pattern = static_cast<unsigned char>(random());
      std::memset(block->pointer(), pattern, block->size);
      if (random() % 4 == 0) BlockCache::record_stream(*block, streams[0] == stream ? streams[1] : streams[0]);
      live.emplace(block, pattern);
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(random() % live.size()));
      const auto* bytes = static_cast<const unsigned char*>(it->first->pointer());
      for (std::size_t i = 0; i < it->first->size; i += 4096) {
        ASSERT_EQ(bytes[i], it->second) << "block " << it->first->pointer() << " was overwritten";
      }
      free(it->first);
      live.erase(it);
    }
    if (step % 8 == 0) cache_.process_events();
    check();
  }
  for (const auto& [block, pattern] : live) free(block);
  cache_.synchronize_pending();
  backend_.destroy_stream(streams[1]);
}

}  // namespace
}  // namespace stowage
