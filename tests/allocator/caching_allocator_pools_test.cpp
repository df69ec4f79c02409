// Private pools of the CachingAllocator (Note [Private pools]): what a CUDA graph capture or a
// torch MemPool relies on. Memory allocated to a pool is never handed to anyone else, the pool
// lives while it is held, a capture makes no event calls, and a checkpoint puts a pool back.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <random>
#include <unordered_set>
#include <vector>

#include "allocator/caching_allocator.hpp"
#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "device/host/host_backend.hpp"
#include "tests/support/quiet_log.hpp"

namespace stowage {
namespace {

constexpr std::size_t MiB = kMiB;
constexpr PoolId kGraph{1, 0};
constexpr PoolId kOtherGraph{2, 0};

HostBackendOptions device_of(std::size_t capacity, bool synchronous = true) {
  HostBackendOptions options;
  options.capacity_bytes = capacity;
  options.synchronous = synchronous;
  return options;
}

// Parameterised over the two paths: private pools always use segments, next to either.
class PoolsTest : public ::testing::TestWithParam<const char*> {
 protected:
  PoolsTest() : backend_(device_of(512 * MiB)), allocator_(backend_, parse_allocator_config(GetParam())) {}
  void TearDown() override { allocator_.check_invariants(); }

  static CachingAllocator::StreamFilter only(Stream stream) {
    return [stream](Stream s) { return s == stream; };
  }
  std::int64_t reserved() const { return allocator_.stats().reserved_bytes.all().current; }

  HostBackend backend_;
  CachingAllocator allocator_;
};

TEST_P(PoolsTest, RequestsOnTheCapturedStreamComeFromThePoolAlone) {
  const Stream captured = backend_.create_stream();
  void* shared_before = allocator_.malloc(3 * MiB);
  allocator_.free(shared_before);  // cached in the shared pools

  allocator_.begin_allocate_to_pool(kGraph, only(captured));
  void* in_pool = allocator_.malloc(3 * MiB, captured);
  void* elsewhere = allocator_.malloc(3 * MiB);  // another stream: the shared pools
  allocator_.end_allocate_to_pool(kGraph);

  EXPECT_NE(in_pool, shared_before) << "a private pool took memory cached in the shared pools";
  EXPECT_EQ(elsewhere, shared_before);
  EXPECT_EQ(allocator_.pool_allocations(kGraph), std::vector<void*>{in_pool});
  EXPECT_EQ(allocator_.pool_use_count(kGraph), 1);
  const AllocatorSnapshot shot = allocator_.snapshot();
  const auto owned = std::count_if(shot.segments.begin(), shot.segments.end(),
                                   [](const SegmentSnapshot& s) { return s.owner == kGraph; });
  EXPECT_EQ(owned, 1);

  // Freed, the pool's block is not for the shared pools, even on the captured stream...
  allocator_.free(in_pool);
  void* after = allocator_.malloc(3 * MiB, captured);
  EXPECT_NE(after, in_pool);
  // ...but the pool's next capture finds it again.
  allocator_.begin_allocate_to_pool(kGraph, only(captured));
  void* again = allocator_.malloc(3 * MiB, captured);
  allocator_.end_allocate_to_pool(kGraph);
  EXPECT_EQ(again, in_pool);
  EXPECT_EQ(allocator_.pool_use_count(kGraph), 2);  // each capture holds the pool
  for (void* p : {after, again, elsewhere}) allocator_.free(p);
  allocator_.release_pool(kGraph);
  allocator_.release_pool(kGraph);
  EXPECT_EQ(allocator_.pool_use_count(kGraph), 0);
}

TEST_P(PoolsTest, AReleasedPoolGivesItsMemoryBackAsItsBlocksAreFreed) {
  const Stream captured = backend_.create_stream();
  allocator_.begin_allocate_to_pool(kGraph, only(captured));
  void* small = allocator_.malloc(100 * 1024, captured);
  void* large = allocator_.malloc(30 * MiB, captured);
  allocator_.end_allocate_to_pool(kGraph);
  const std::int64_t held = reserved();
  EXPECT_GE(held, static_cast<std::int64_t>(30 * MiB));

  allocator_.release_pool(kGraph);  // the graph is gone, its output tensors are not
  EXPECT_EQ(reserved(), held);
  allocator_.empty_cache();
  EXPECT_EQ(reserved(), held) << "empty_cache returned memory that is still in use";
  allocator_.free(large);
  EXPECT_LT(reserved(), held);
  allocator_.free(small);
  EXPECT_EQ(reserved(), 0);
  EXPECT_EQ(allocator_.pool_use_count(kGraph), 0);
  EXPECT_TRUE(allocator_.pool_allocations(kGraph).empty());
}

TEST_P(PoolsTest, AHeldPoolKeepsItsCacheThroughEmptyCache) {
  const Stream captured = backend_.create_stream();
  allocator_.create_or_incref_pool(kGraph);  // a MemPool
  allocator_.begin_allocate_to_pool(kGraph, only(captured));
  void* block = allocator_.malloc(8 * MiB, captured);
  allocator_.end_allocate_to_pool(kGraph);
  allocator_.free(block);
  const std::int64_t held = reserved();
  allocator_.empty_cache();
  EXPECT_EQ(reserved(), held);
  allocator_.release_pool(kGraph);  // the capture's hold
  EXPECT_EQ(reserved(), held);
  allocator_.release_pool(kGraph);  // the MemPool's
  EXPECT_EQ(reserved(), 0);
}

TEST_P(PoolsTest, TwoGraphsSharingAPoolReuseEachOthersFreedBlocks) {
  const Stream captured = backend_.create_stream();
  allocator_.begin_allocate_to_pool(kGraph, only(captured));
  void* first = allocator_.malloc(5 * MiB, captured);
  allocator_.free(first);  // freed inside the capture: the same capture may reuse it
  void* second = allocator_.malloc(5 * MiB, captured);
  EXPECT_EQ(second, first);
  allocator_.end_allocate_to_pool(kGraph);
  // A second graph in another pool does not see it.
  allocator_.free(second);
  allocator_.begin_allocate_to_pool(kOtherGraph, only(captured));
  void* other = allocator_.malloc(5 * MiB, captured);
  allocator_.end_allocate_to_pool(kOtherGraph);
  EXPECT_NE(other, first);
  allocator_.free(other);
  allocator_.release_pool(kGraph);
  allocator_.release_pool(kOtherGraph);
  EXPECT_EQ(reserved(), 0);
}

TEST_P(PoolsTest, MisuseIsRefusedWithAMessage) {
  const Stream captured = backend_.create_stream();
  EXPECT_THROW(allocator_.end_allocate_to_pool(kGraph), LogicError);
  EXPECT_THROW(allocator_.release_pool(kGraph), LogicError);
  EXPECT_THROW(allocator_.begin_allocate_to_pool({0, 0}, only(captured)), LogicError);
  EXPECT_THROW(allocator_.begin_allocate_to_pool(kGraph, {}), LogicError);
  allocator_.begin_allocate_to_pool(kGraph, only(captured));
  EXPECT_THROW(allocator_.begin_allocate_to_pool(kGraph, only(captured)), LogicError);
  EXPECT_THROW(allocator_.empty_cache(), LogicError);
  allocator_.end_allocate_to_pool(kGraph);
  allocator_.release_pool(kGraph);
  EXPECT_THROW(allocator_.checkpoint_pool(kGraph), LogicError);
}

TEST_P(PoolsTest, ACheckpointPutsThePoolBackAtTheSameAddresses) {
  const Stream captured = backend_.create_stream();
  allocator_.begin_allocate_to_pool(kGraph, only(captured));
  void* a = allocator_.malloc(2 * MiB, captured);
  void* b = allocator_.malloc(3 * MiB, captured);
  void* c = allocator_.malloc(1 * MiB + 512, captured);
  allocator_.free(b);
  const PoolCheckpoint checkpoint = allocator_.checkpoint_pool(kGraph);
  // The pool moves on: c goes, b's space is taken by others.
  allocator_.free(c);
  void* d = allocator_.malloc(4 * MiB, captured);
  void* e = allocator_.malloc(512, captured);
  allocator_.end_allocate_to_pool(kGraph);
  allocator_.check_invariants();

  const PoolRestore restore = allocator_.restore_pool(checkpoint);
  std::unordered_set<void*> freed(restore.freed.begin(), restore.freed.end());
  EXPECT_EQ(freed, (std::unordered_set<void*>{a, d, e}));
  EXPECT_EQ(restore.allocated, (std::vector<void*>{a, c}));
  EXPECT_EQ(allocator_.pool_allocations(kGraph), (std::vector<void*>{a, c}));
  EXPECT_EQ(allocator_.block_size(c), 1 * MiB + 512);
  allocator_.check_invariants();
  // The layout is the checkpoint's: the next 3 MiB request lands where b was.
  allocator_.begin_allocate_to_pool(kGraph, only(captured));
  EXPECT_EQ(allocator_.malloc(3 * MiB, captured), b);
  allocator_.end_allocate_to_pool(kGraph);
  allocator_.free(b);
  allocator_.free(a);
  allocator_.free(c);
  allocator_.release_pool(kGraph);
  allocator_.release_pool(kGraph);
  EXPECT_EQ(reserved(), 0);
}

TEST_P(PoolsTest, ACheckpointOfSegmentsThatAreGoneIsRefusedAndChangesNothing) {
  const Stream captured = backend_.create_stream();
  allocator_.begin_allocate_to_pool(kGraph, only(captured));
  void* a = allocator_.malloc(2 * MiB, captured);
  allocator_.end_allocate_to_pool(kGraph);
  PoolCheckpoint checkpoint = allocator_.checkpoint_pool(kGraph);
  checkpoint.segments[0].base += 4096;
  EXPECT_THROW(allocator_.restore_pool(checkpoint), LogicError);
  checkpoint.segments[0].base -= 4096;
  checkpoint.segments[0].blocks[0].size += 512;
  EXPECT_THROW(allocator_.restore_pool(checkpoint), LogicError);
  EXPECT_EQ(allocator_.pool_allocations(kGraph), std::vector<void*>{a});
  allocator_.free(a);
  allocator_.release_pool(kGraph);
}

TEST_P(PoolsTest, BaseAllocationAndTheLargestAvailableBlock) {
  void* block = allocator_.malloc(3 * MiB);
  const auto [base, bytes] = allocator_.base_allocation(block);
  ASSERT_NE(base, nullptr);
  EXPECT_LE(static_cast<char*>(base), static_cast<char*>(block));
  EXPECT_GE(static_cast<char*>(base) + bytes, static_cast<char*>(block) + 3 * MiB);
  EXPECT_EQ(allocator_.base_allocation(static_cast<char*>(block) + 512).first, nullptr);
  // Nothing cached: what the device still has.
  EXPECT_EQ(allocator_.largest_available_block(), backend_.memory_info().free_bytes);
  allocator_.set_limit(64 * MiB);
  EXPECT_EQ(allocator_.largest_available_block(),
            64 * MiB - static_cast<std::size_t>(reserved()));
  allocator_.free(block);
}

TEST_P(PoolsTest, RandomCapturesKeepTheInvariantsAndNeverShareMemory) {
  std::mt19937_64 random(7);
  const Stream streams[2] = {backend_.create_stream(), backend_.create_stream()};
  const PoolId pools[3] = {{1, 0}, {2, 0}, {3, 0}};
  struct Live {
    void* ptr;
    std::size_t bytes;
    PoolId pool;  // {0, 0}: shared
  };
  std::vector<Live> live;
  int held[3] = {0, 0, 0};
  int capturing = -1;
  for (int step = 0; step < 3000; ++step) {
    const auto op = random() % 10;
    if (op < 5) {
      const std::size_t bytes = std::size_t{1} << (random() % 24);
      const Stream stream = streams[random() % 2];
      const bool to_pool = capturing >= 0 && stream == streams[0];
      try {
        void* ptr = allocator_.malloc(bytes, stream);
        live.push_back({ptr, bytes, to_pool ? pools[capturing] : PoolId{0, 0}});
      } catch (const OutOfMemory&) {
      }
    } else if (op < 8 && !live.empty()) {
      const std::size_t i = random() % live.size();
      allocator_.free(live[i].ptr);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (op == 8) {
      if (capturing < 0) {
        capturing = static_cast<int>(random() % 3);
        allocator_.begin_allocate_to_pool(pools[capturing], only(streams[0]));
        ++held[capturing];
      } else {
        allocator_.end_allocate_to_pool(pools[capturing]);
        capturing = -1;
      }
    } else {
      const auto p = random() % 3;
      if (held[p] > (capturing == static_cast<int>(p) ? 1 : 0)) {
        allocator_.release_pool(pools[p]);
        --held[p];
      }
    }
    // No two live allocations overlap, and each pool's allocations are exactly its own.
    allocator_.check_invariants();
    for (int p = 0; p < 3; ++p) {
      std::vector<void*> expected;
      for (const Live& l : live) {
        if (l.pool == pools[p]) expected.push_back(l.ptr);
      }
      std::vector<void*> actual = allocator_.pool_allocations(pools[p]);
      std::sort(expected.begin(), expected.end());
      std::sort(actual.begin(), actual.end());
      ASSERT_EQ(actual, expected) << "step " << step;
    }
  }
  if (capturing >= 0) allocator_.end_allocate_to_pool(pools[capturing]);
  for (const Live& l : live) allocator_.free(l.ptr);
  for (int p = 0; p < 3; ++p) {
    while (held[p]-- > 0) allocator_.release_pool(pools[p]);
  }
  allocator_.empty_cache();
  EXPECT_EQ(reserved(), 0);
}

TEST_P(PoolsTest, RestoringFreesEveryAllocationEvenWhenFreesCoalesce) {
  // allocated / free / allocated / allocated in one segment: freeing the first coalesces it
  // with the free block after it.
  const Stream captured = backend_.create_stream();
  allocator_.begin_allocate_to_pool(kGraph, only(captured));
  void* p = allocator_.malloc(MiB, captured);
  void* q = allocator_.malloc(MiB, captured);
  void* r = allocator_.malloc(MiB, captured);
  void* t = allocator_.malloc(MiB, captured);
  allocator_.end_allocate_to_pool(kGraph);
  const PoolCheckpoint empty_checkpoint = [&] {
    PoolCheckpoint checkpoint = allocator_.checkpoint_pool(kGraph);
    for (auto& segment : checkpoint.segments) {
      std::size_t total = 0;
      for (const auto& block : segment.blocks) total += block.size;
      segment.blocks = {{total, 0, false, 0}};
    }
    return checkpoint;
  }();
  allocator_.free(q);
  const PoolRestore restore = allocator_.restore_pool(empty_checkpoint);
  std::unordered_set<void*> freed(restore.freed.begin(), restore.freed.end());
  EXPECT_EQ(freed, (std::unordered_set<void*>{p, r, t}));
  EXPECT_TRUE(restore.allocated.empty());
  EXPECT_TRUE(allocator_.pool_allocations(kGraph).empty());
  allocator_.check_invariants();
  allocator_.release_pool(kGraph);
  EXPECT_EQ(reserved(), 0);
}

TEST_P(PoolsTest, AnUnheldPoolCannotBeRestored) {
  const Stream captured = backend_.create_stream();
  allocator_.begin_allocate_to_pool(kGraph, only(captured));
  void* a = allocator_.malloc(MiB, captured);
  void* b = allocator_.malloc(MiB, captured);
  allocator_.end_allocate_to_pool(kGraph);
  const PoolCheckpoint checkpoint = allocator_.checkpoint_pool(kGraph);
  allocator_.release_pool(kGraph);  // nobody holds it; its tensors live on
  EXPECT_THROW(allocator_.restore_pool(checkpoint), LogicError);
  EXPECT_EQ(allocator_.pool_allocations(kGraph), (std::vector<void*>{a, b}));
  allocator_.free(a);
  allocator_.free(b);
  EXPECT_EQ(reserved(), 0);
}

TEST_P(PoolsTest, NoMemoryGoesBackWhileAnotherPoolCaptures) {
  const Stream captured = backend_.create_stream();
  allocator_.begin_allocate_to_pool(kGraph, only(captured));
  allocator_.free(allocator_.malloc(8 * MiB, captured));
  allocator_.end_allocate_to_pool(kGraph);
  const std::int64_t held = reserved();
  allocator_.begin_allocate_to_pool(kOtherGraph, only(captured));
  allocator_.release_pool(kGraph);  // an old graph dropped while a new one captures
  EXPECT_EQ(reserved(), held + 0) << "device memory was freed during a capture";
  allocator_.end_allocate_to_pool(kOtherGraph);
  allocator_.release_pool(kOtherGraph);
  allocator_.empty_cache();  // after the capture, the unheld pool's memory goes back
  EXPECT_EQ(reserved(), 0);
}

TEST_P(PoolsTest, APoolsCacheCanBeReleasedWhileItIsHeld) {
  const Stream captured = backend_.create_stream();
  allocator_.create_or_incref_pool(kGraph);
  allocator_.begin_allocate_to_pool(kGraph, only(captured));
  void* kept = allocator_.malloc(MiB, captured);
  allocator_.free(allocator_.malloc(30 * MiB, captured));
  allocator_.end_allocate_to_pool(kGraph);
  allocator_.release_pool(kGraph);
  const std::int64_t held = reserved();
  EXPECT_TRUE(allocator_.release_pool_cache(kGraph));
  EXPECT_LT(reserved(), held);
  EXPECT_EQ(allocator_.pool_use_count(kGraph), 1);
  EXPECT_FALSE(allocator_.release_pool_cache(kOtherGraph));
  allocator_.free(kept);
  allocator_.release_pool(kGraph);
  EXPECT_EQ(reserved(), 0);
}

INSTANTIATE_TEST_SUITE_P(BothPaths, PoolsTest,
                         ::testing::Values("virtual_memory:off", "virtual_memory:on"),
                         [](const auto& param_info) {
                           return std::string(param_info.param).find("off") != std::string::npos
                                      ? "Segments"
                                      : "Paged";
                         });

TEST(PoolsCaptureTest, ACaptureMakesNoEventCallsAndFreesWaitUntilItEnds) {
  // An asynchronous device: a stream held busy keeps a recorded block pending.
  HostBackend backend(device_of(256 * MiB, /*synchronous=*/false));
  CachingAllocator allocator(backend);
  const Stream side = backend.create_stream();
  const Stream captured = backend.create_stream();
  void* shared = allocator.malloc(4 * MiB);
  allocator.record_stream(shared, side);

  allocator.begin_allocate_to_pool(kGraph, [&](Stream s) { return s == captured; });
  const auto events_before = backend.faults().calls(BackendCall::kRecordEvent);
  allocator.free(shared);  // needs an event on `side`: deferred
  void* in_pool = allocator.malloc(MiB, captured);
  void* other = allocator.malloc(4 * MiB);
  EXPECT_NE(other, shared) << "a block still in use on another stream was handed out";
  EXPECT_EQ(backend.faults().calls(BackendCall::kRecordEvent), events_before)
      << "an event was recorded during a capture";
  allocator.end_allocate_to_pool(kGraph);
  allocator.check_invariants();

  // After the capture the deferred free records its event and completes.
  void* next = allocator.malloc(512);
  EXPECT_GT(backend.faults().calls(BackendCall::kRecordEvent), events_before);
  backend.synchronize_device();
  allocator.empty_cache();
  for (void* p : {in_pool, other, next}) allocator.free(p);
  allocator.release_pool(kGraph);
  allocator.empty_cache();
  allocator.check_invariants();
  EXPECT_EQ(allocator.stats().reserved_bytes.all().current, 0);
}

}  // namespace
}  // namespace stowage

namespace stowage {
namespace {

// The case torch's default stream makes: a block of a side stream used on Stream{0}, freed while
// Stream{0} is busy, is not handed out again on the side stream (on either path).
TEST(RecordStreamTest, ABlockUsedOnTheDefaultStreamWaitsForIt) {
  for (const char* config : {"virtual_memory:off", "virtual_memory:on"}) {
    HostBackend backend(device_of(256 * MiB, /*synchronous=*/false));
    CachingAllocator allocator(backend, parse_allocator_config(config));
    const Stream side = backend.create_stream();
    void* result = allocator.malloc(16 * MiB);
    void* x = allocator.malloc(16 * MiB, side);
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    backend.enqueue_host_function(Stream{0}, [released] { released.wait(); });
    allocator.record_stream(x, Stream{0});
    allocator.free(x);
    void* y = allocator.malloc(16 * MiB, side);
    EXPECT_NE(y, x) << config << ": reused while the default stream may still read it";
    release.set_value();
    backend.synchronize_device();
    for (void* p : {result, y}) allocator.free(p);
    allocator.empty_cache();
    allocator.check_invariants();
  }
}

}  // namespace
}  // namespace stowage

namespace stowage {
namespace {

TEST(PoolOptionsTest, APoolThatLendsOnOomServesOthersAndGetsItsBlockBack) {
  HostBackend backend(device_of(64 * MiB));
  CachingAllocator allocator(backend, parse_allocator_config("virtual_memory:off"));
  const Stream captured = backend.create_stream();
  allocator.create_or_incref_pool(kGraph);
  allocator.begin_allocate_to_pool(kGraph, [&](Stream s) { return s == captured; });
  void* in_pool = allocator.malloc(40 * MiB, captured);
  allocator.end_allocate_to_pool(kGraph);
  allocator.release_pool(kGraph);  // the capture's hold; the MemPool's stays
  allocator.free(in_pool);
  // The device is full of the pool's cache: without lending, a request outside fails.
  EXPECT_THROW(allocator.malloc(30 * MiB, captured), OutOfMemory);
  allocator.set_pool_use_on_oom(kGraph, true);
  void* borrowed = allocator.malloc(30 * MiB, captured);
  EXPECT_EQ(borrowed, in_pool);
  allocator.free(borrowed);
  EXPECT_EQ(allocator.pool_allocations(kGraph), std::vector<void*>{});
  // Back in the pool: the pool's next capture finds it.
  allocator.begin_allocate_to_pool(kGraph, [&](Stream s) { return s == captured; });
  EXPECT_EQ(allocator.malloc(40 * MiB, captured), in_pool);
  allocator.end_allocate_to_pool(kGraph);
  allocator.free(in_pool);
  allocator.release_pool(kGraph);
  allocator.release_pool(kGraph);
  EXPECT_EQ(allocator.stats().reserved_bytes.all().current, 0);
  EXPECT_THROW(allocator.set_pool_use_on_oom(kGraph, false), LogicError);
  allocator.check_invariants();
}

TEST(PoolOptionsTest, ANoSplitPoolHandsOutWholeBlocks) {
  HostBackend backend(device_of(64 * MiB));
  CachingAllocator allocator(backend, parse_allocator_config("virtual_memory:off"));
  const Stream captured = backend.create_stream();
  allocator.create_or_incref_pool(kGraph);
  allocator.set_pool_no_split(kGraph);
  allocator.begin_allocate_to_pool(kGraph, [&](Stream s) { return s == captured; });
  void* first = allocator.malloc(3 * MiB, captured);
  void* second = allocator.malloc(3 * MiB, captured);
  allocator.end_allocate_to_pool(kGraph);
  EXPECT_EQ(allocator.block_size(first), SizePolicy::segment_size(3 * MiB));
  EXPECT_NE(allocator.base_allocation(first).first, allocator.base_allocation(second).first);
  allocator.free(first);
  allocator.free(second);
  allocator.release_pool(kGraph);
  allocator.release_pool(kGraph);
  allocator.check_invariants();
}

}  // namespace
}  // namespace stowage
