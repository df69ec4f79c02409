// The CachingAllocator's rules, one test each, on the simulated device.
#include "allocator/caching_allocator.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/errors.hpp"
#include "base/log.hpp"
#include "device/host/host_backend.hpp"
#include "tests/support/captured_log.hpp"
#include "tests/support/gate.hpp"

namespace stowage {
namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = kMiB;

HostBackendOptions device_of(std::size_t capacity, bool synchronous = true) {
  HostBackendOptions options;
  options.capacity_bytes = capacity;
  options.synchronous = synchronous;
  return options;
}

std::uintptr_t address(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

using testing::CapturedLog;
using testing::Gate;

// These tests pin down the segment path (virtual_memory:off); the paged path has its own
// (caching_allocator_paged_test.cpp).
// With room to spare (reserve_headroom:1), so cached segments stay cached until a miss: these
// tests pin the cache's mechanics; Note [Reserve budget] has tests of its own below.
const AllocatorConfig kSegmentPath = parse_allocator_config("virtual_memory:off,reserve_headroom:1");

class CachingAllocatorTest : public ::testing::Test {
 protected:
  explicit CachingAllocatorTest(HostBackendOptions options = device_of(256 * MiB))
      : backend_(options) {}
  void TearDown() override { allocator_.check_invariants(); }

  HostBackend backend_;
  CachingAllocator allocator_{backend_, kSegmentPath};
};

TEST_F(CachingAllocatorTest, RoundsEveryRequestTo512Bytes) {
  void* tiny = allocator_.malloc(1);
  void* small = allocator_.malloc(1000);
  void* large = allocator_.malloc(MiB + 1);
  EXPECT_EQ(allocator_.block_size(tiny), 512u);
  EXPECT_EQ(allocator_.block_size(small), 1024u);
  EXPECT_EQ(allocator_.block_size(large), MiB + 512) << "no 2 MiB rounding in the large class";
  const DeviceStats stats = allocator_.stats();
  EXPECT_EQ(stats.requested_bytes.all().current, static_cast<std::int64_t>(1 + 1000 + MiB + 1));
  EXPECT_EQ(stats.allocated_bytes.all().current, static_cast<std::int64_t>(512 + 1024 + MiB + 512));
  allocator_.free(tiny);
  allocator_.free(small);
  allocator_.free(large);
}

TEST_F(CachingAllocatorTest, SmallRequestsArePackedIntoTwoMiBSegments) {
  std::vector<void*> blocks;
  for (int i = 0; i < 100; ++i) blocks.push_back(allocator_.malloc(20 * KiB));  // 2000 KiB
  DeviceStats stats = allocator_.stats();
  EXPECT_EQ(stats.segment.of(SizeClass::kSmall).current, 1);
  EXPECT_EQ(stats.reserved_bytes.of(SizeClass::kSmall).current, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(stats.segment.of(SizeClass::kLarge).current, 0);
  blocks.push_back(allocator_.malloc(100 * KiB));  // does not fit the 48 KiB left
  EXPECT_EQ(allocator_.stats().segment.of(SizeClass::kSmall).current, 2);
  for (void* block : blocks) allocator_.free(block);
}

TEST_F(CachingAllocatorTest, MediumRequestsShareTwentyMiBSegmentsAndLargeOnesGetTheirOwn) {
  void* a = allocator_.malloc(5 * MiB);
  void* b = allocator_.malloc(5 * MiB);
  void* c = allocator_.malloc(5 * MiB);
  EXPECT_EQ(allocator_.stats().segment.of(SizeClass::kLarge).current, 1);
  EXPECT_EQ(allocator_.stats().reserved_bytes.of(SizeClass::kLarge).current,
            static_cast<std::int64_t>(20 * MiB));
  // 11 MiB gets a 12 MiB segment; the 1 MiB left is not worth a block of its own.
  void* d = allocator_.malloc(11 * MiB);
  EXPECT_EQ(allocator_.block_size(d), 12 * MiB);
  // 10.5 MiB gets a 12 MiB segment too; 1.5 MiB is worth keeping, so it is split off.
  void* e = allocator_.malloc(10 * MiB + 512 * KiB);
  EXPECT_EQ(allocator_.block_size(e), 10 * MiB + 512 * KiB);
  EXPECT_EQ(allocator_.stats().inactive_split.of(SizeClass::kLarge).current, 2)
      << "the 5 MiB tail of the medium segment and the 1.5 MiB tail";
  for (void* block : {a, b, c, d, e}) allocator_.free(block);
}

TEST_F(CachingAllocatorTest, BestFitTakesTheSmallestFreeBlockThenTheLowestAddress) {
  // One 20 MiB segment: [a 2][b 3][c 2][d 3][e 2][tail 8] MiB.
  void* a = allocator_.malloc(2 * MiB);
  void* b = allocator_.malloc(3 * MiB);
  void* c = allocator_.malloc(2 * MiB);
  void* d = allocator_.malloc(3 * MiB);
  void* e = allocator_.malloc(2 * MiB);
  allocator_.free(d);
  allocator_.free(b);
  void* first = allocator_.malloc(3 * MiB);
  EXPECT_EQ(first, b) << "two 3 MiB holes: the lower one";
  void* second = allocator_.malloc(2 * MiB + 512 * KiB);
  EXPECT_EQ(second, d) << "the 3 MiB hole fits better than the 8 MiB tail";
  for (void* block : {a, c, e, first, second}) allocator_.free(block);
}

TEST_F(CachingAllocatorTest, FreedBlocksCoalesceWithFreeNeighbours) {
  void* a = allocator_.malloc(4 * MiB);
  void* b = allocator_.malloc(4 * MiB);
  void* c = allocator_.malloc(4 * MiB);
  allocator_.free(b);
  EXPECT_EQ(allocator_.stats().inactive_split.all().current, 2) << "b's hole and the tail";
  allocator_.free(a);  // merges with b
  const std::size_t segment = SizePolicy::segment_size(4 * MiB);
  EXPECT_EQ(allocator_.stats().inactive_split.all().current, 2);
  EXPECT_EQ(allocator_.stats().inactive_split_bytes.all().current,
            static_cast<std::int64_t>(segment - 4 * MiB));
  allocator_.free(c);  // merges with both sides: the segment is one free block again
  const AllocatorSnapshot snapshot = allocator_.snapshot();
  ASSERT_EQ(snapshot.segments.size(), 1u);
  ASSERT_EQ(snapshot.segments[0].blocks.size(), 1u);
  EXPECT_EQ(snapshot.segments[0].blocks[0].size, segment);
  EXPECT_EQ(allocator_.stats().inactive_split.all().current, 0);
  allocator_.empty_cache();
  EXPECT_EQ(allocator_.stats().reserved_bytes.all().current, 0);
  EXPECT_EQ(backend_.used_bytes(), 0u);
}

TEST_F(CachingAllocatorTest, SmallPoolSplitsAnyRemainderOf512BytesOrMore) {
  void* a = allocator_.malloc(MiB);
  void* b = allocator_.malloc(MiB - 512);
  void* c = allocator_.malloc(512);
  EXPECT_EQ(address(c), address(a) + 2 * MiB - 512) << "the last 512 B were kept and used";
  EXPECT_EQ(allocator_.stats().segment.all().current, 1);
  for (void* block : {a, b, c}) allocator_.free(block);
}

TEST_F(CachingAllocatorTest, ReuseOnTheSameStreamIsImmediateAndNeverCrossesStreams) {
  const Stream other = backend_.create_stream();
  void* a = allocator_.malloc(MiB);
  allocator_.free(a);
  EXPECT_EQ(allocator_.malloc(MiB), a);
  allocator_.free(a);
  void* on_other = allocator_.malloc(MiB, other);
  EXPECT_NE(on_other, a) << "a block cached for stream 0 was handed to another stream";
  EXPECT_EQ(allocator_.stats().segment.all().current, 2);
  allocator_.free(on_other);
  backend_.destroy_stream(other);
}

class CachingAllocatorStreamsTest : public CachingAllocatorTest {
 protected:
  CachingAllocatorStreamsTest() : CachingAllocatorTest(device_of(256 * MiB, false)) {}
};

TEST_F(CachingAllocatorStreamsTest, RecordStreamDefersReuseUntilTheStreamCatchesUp) {
  const Stream side = backend_.create_stream();
  Gate gate;
  backend_.enqueue_host_function(side, gate.blocker());
  void* block = allocator_.malloc(64 * KiB);
  allocator_.record_stream(block, side);
  allocator_.free(block);
  DeviceStats stats = allocator_.stats();
  EXPECT_EQ(stats.allocation.all().current, 0);
  EXPECT_EQ(stats.active.all().current, 1) << "freed but pending on the side stream";
  EXPECT_EQ(allocator_.snapshot().segments[0].blocks[0].state, BlockState::kPendingFree);

  // malloc does not wait for the blocked stream: it returns another block at once.
  void* meanwhile = allocator_.malloc(64 * KiB);
  EXPECT_NE(meanwhile, block);
  gate.open();
  backend_.synchronize_stream(side);
  void* later = allocator_.malloc(64 * KiB);
  EXPECT_EQ(later, block) << "once the side stream passed the event, the block is reused";
  allocator_.free(meanwhile);
  allocator_.free(later);
  backend_.destroy_stream(side);
}

TEST_F(CachingAllocatorStreamsTest, EmptyCacheWaitsForPendingFrees) {
  const Stream side = backend_.create_stream();
  void* block = allocator_.malloc(MiB);
  backend_.enqueue_host_function(side, [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  allocator_.record_stream(block, side);
  allocator_.free(block);
  allocator_.empty_cache();
  EXPECT_EQ(allocator_.stats().reserved_bytes.all().current, 0);
  EXPECT_EQ(allocator_.stats().num_sync_all_streams, 1);
  backend_.destroy_stream(side);
}

TEST_F(CachingAllocatorTest, RecordStreamOfAnUnknownPointerIsAnError) {
  int local = 0;
  EXPECT_THROW(allocator_.record_stream(&local, Stream{0}), LogicError);
}

class SmallDeviceTest : public CachingAllocatorTest {
 protected:
  SmallDeviceTest() : CachingAllocatorTest(device_of(64 * MiB)) {}
};

TEST_F(SmallDeviceTest, AMissReleasesCachedSegmentsAndRetries) {
  void* a = allocator_.malloc(30 * MiB);
  allocator_.free(a);  // cached: 30 MiB reserved, none allocated
  void* b = allocator_.malloc(40 * MiB);  // 30 + 40 > 64: release the cache, then fits
  ASSERT_NE(b, nullptr);
  const DeviceStats stats = allocator_.stats();
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_device_free, 1);
  EXPECT_EQ(stats.reserved_bytes.all().current, static_cast<std::int64_t>(40 * MiB));
  allocator_.free(b);
}

TEST_F(SmallDeviceTest, WithoutRoomForASharedSegmentAMediumBlockGetsASegmentOfItsOwn) {
  void* held = allocator_.malloc(50 * MiB);  // leaves 14 MiB: no room for a 20 MiB segment
  void* medium = allocator_.malloc(3 * MiB);
  EXPECT_EQ(allocator_.stats().reserved_bytes.all().current, static_cast<std::int64_t>(54 * MiB))
      << "a 4 MiB segment, the 3 MiB block rounded to 2 MiB";
  allocator_.free(medium);
  allocator_.free(held);
}

TEST_F(SmallDeviceTest, ATransientDeviceFailureIsRetried) {
  backend_.faults().fail_nth(BackendCall::kAllocateSegment, 1);
  void* block = allocator_.malloc(MiB);
  EXPECT_NE(block, nullptr);
  EXPECT_EQ(allocator_.stats().num_alloc_retries, 1);
  allocator_.free(block);
}

// Frees a block it holds when asked, as the offloader will.
class HoldingHandler : public MemoryPressureHandler {
 public:
  explicit HoldingHandler(CachingAllocator& allocator, void* held, std::size_t bytes)
      : allocator_(allocator), held_(held), bytes_(bytes) {}
  std::size_t relieve_pressure(std::size_t, Stream) noexcept override {
    ++calls;
    if (held_ == nullptr) return 0;
    allocator_.free(held_);  // the allocator's lock is not held here
    held_ = nullptr;
    return bytes_;
  }
  int calls = 0;

 private:
  CachingAllocator& allocator_;
  void* held_;
  std::size_t bytes_;
};

TEST_F(SmallDeviceTest, PressureHandlersRunOnlyAfterTheCheapStepsFail) {
  HoldingHandler handler(allocator_, allocator_.malloc(40 * MiB), 40 * MiB);
  allocator_.add_pressure_handler(&handler);
  void* fits = allocator_.malloc(20 * MiB);
  EXPECT_EQ(handler.calls, 0) << "the device had room: no eviction";
  void* needs_room = allocator_.malloc(30 * MiB);
  EXPECT_EQ(handler.calls, 1);
  EXPECT_NE(needs_room, nullptr);
  allocator_.remove_pressure_handler(&handler);
  allocator_.free(fits);
  allocator_.free(needs_room);
}

TEST_F(SmallDeviceTest, AllocatedCeilingLetsGoOfTheExcessFirstAndNeverFailsARequest) {
  HoldingHandler handler(allocator_, allocator_.malloc(10 * MiB), 10 * MiB);
  allocator_.add_pressure_handler(&handler);
  allocator_.set_allocated_ceiling(32 * MiB);
  EXPECT_EQ(allocator_.largest_available_block(), 22 * MiB) << "what the ceiling leaves";
  void* under = allocator_.malloc(20 * MiB);
  EXPECT_EQ(handler.calls, 0) << "30 MiB allocated is under the ceiling";
  void* over = allocator_.malloc(8 * MiB);
  EXPECT_EQ(handler.calls, 1) << "38 MiB would pass the ceiling: the handler lets go first";
  EXPECT_EQ(allocator_.stats().allocated_bytes.all().current, static_cast<std::int64_t>(28 * MiB));
  void* past = allocator_.malloc(8 * MiB);
  EXPECT_EQ(handler.calls, 2);
  EXPECT_NE(past, nullptr) << "nothing left to let go: served past the ceiling, not refused";
  EXPECT_EQ(allocator_.largest_available_block(), 0u);
  EXPECT_EQ(allocator_.stats().num_ooms, 0);
  allocator_.set_allocated_ceiling(CachingAllocator::kNoCeiling);
  EXPECT_EQ(allocator_.allocated_ceiling(), CachingAllocator::kNoCeiling);
  EXPECT_GT(allocator_.largest_available_block(), 0u);
  allocator_.remove_pressure_handler(&handler);
  for (void* block : {under, over, past}) allocator_.free(block);
}

TEST_F(SmallDeviceTest, OutOfMemoryExplainsAndLeavesTheAllocatorUsable) {
  void* held = allocator_.malloc(40 * MiB);
  std::vector<OomReport> observed;
  const std::size_t observer =
      allocator_.add_oom_observer([&](const OomReport& report) { observed.push_back(report); });
  std::size_t removed_calls = 0;
  allocator_.remove_oom_observer(
      allocator_.add_oom_observer([&](const OomReport&) { ++removed_calls; }));
  allocator_.record_history(true);
  EXPECT_TRUE(allocator_.history_enabled());
  try {
    allocator_.malloc(30 * MiB);
    FAIL() << "30 MiB fitted beside 40 MiB on a 64 MiB device";
  } catch (const OutOfMemory& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.rfind("CPU out of memory. Tried to allocate 30.00 MiB. The simulated device has a "
                            "total capacity of 64.00 MiB of which 24.00 MiB is free. ", 0), 0u)
        << "torch's opening: " << message;
    for (const char* part : {"Of the allocated memory 40.00 MiB is in use, and 0 bytes is reserved by "
                             "stowage but unallocated.", "Live blocks hold the memory",
                             "the request is 6.00 MiB more than the larger"}) {
      EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in\n"
                                                       << message;
    }
  }
  ASSERT_EQ(observed.size(), 1u);
  EXPECT_EQ(removed_calls, 0u) << "a removed observer is not called";
  allocator_.remove_oom_observer(observer);
  EXPECT_EQ(observed[0].requested, 30 * MiB);
  EXPECT_EQ(observed[0].device_free, 24 * MiB);
  EXPECT_EQ(allocator_.stats().num_ooms, 1);
  const auto trace = allocator_.snapshot().trace;
  ASSERT_FALSE(trace.empty());
  EXPECT_EQ(trace.back().action, TraceAction::kOom);
  EXPECT_EQ(trace.back().size, 30 * MiB);
  EXPECT_EQ(trace.back().address, 24 * MiB) << "oom events carry the device's free bytes";

  allocator_.free(held);
  void* retry = allocator_.malloc(30 * MiB);
  EXPECT_NE(retry, nullptr);
  allocator_.free(retry);
}

TEST_F(SmallDeviceTest, OutOfMemoryNamesFragmentation) {
  // Fill the device with 5 MiB blocks in 20 MiB segments, then free every other one: plenty
  // of memory is free, none of it in one piece of 12 MiB.
  ASSERT_EQ(SizePolicy::segment_size(5 * MiB), 20 * MiB);
  std::vector<void*> blocks;
  for (int i = 0; i < 12; ++i) blocks.push_back(allocator_.malloc(5 * MiB));
  for (std::size_t i = 0; i < blocks.size(); i += 2) allocator_.free(blocks[i]);
  try {
    allocator_.malloc(12 * MiB);
    FAIL() << "expected out of memory";
  } catch (const OutOfMemory& error) {
    EXPECT_NE(std::string(error.what()).find("not in one piece"), std::string::npos)
        << error.what();
  }
  for (std::size_t i = 1; i < blocks.size(); i += 2) allocator_.free(blocks[i]);
}

// The device is full and stowage's cache holds 1.75 MiB free in a large-class block: a small
// request could be held by the cache's free bytes, but by no block of its class.
TEST_F(SmallDeviceTest, FreeCacheBytesOfTheOtherSizeClassAreFragmentationNotASplit) {
  void* whole = allocator_.malloc(60 * MiB);
  allocator_.free(whole);
  void* held = allocator_.malloc(58 * MiB + 256 * KiB);  // leaves a free 1.75 MiB block beside it
  std::vector<void*> small;
  for (int i = 0; i < 4; ++i) small.push_back(allocator_.malloc(MiB));  // two full 2 MiB segments
  ASSERT_EQ(backend_.memory_info().free_bytes, 0u);
  try {
    allocator_.malloc(672 * KiB);
    FAIL() << "672 KiB fitted on a full device";
  } catch (const OutOfMemory& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("this is fragmentation"), std::string::npos) << message;
    EXPECT_NE(message.find("a free block of 1.75 MiB serves the other size class"), std::string::npos)
        << message;
    EXPECT_EQ(message.find("neither"), std::string::npos) << message;
  }
  for (void* block : small) allocator_.free(block);
  allocator_.free(held);
}

// 12 MiB free on the device and 4 MiB in the cache, 14 MiB asked: together they would, neither
// does alone; that is not fragmentation.
TEST_F(SmallDeviceTest, ARequestNeitherTheDeviceNorTheCacheHoldsAloneIsNotFragmentation) {
  void* whole = allocator_.malloc(40 * MiB);
  allocator_.free(whole);
  void* held = allocator_.malloc(36 * MiB);  // leaves a free 4 MiB block beside it
  void* more = allocator_.malloc(12 * MiB);
  ASSERT_EQ(backend_.memory_info().free_bytes, 12 * MiB);
  try {
    allocator_.malloc(14 * MiB);
    FAIL() << "14 MiB fitted";
  } catch (const OutOfMemory& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("Live blocks hold the memory"), std::string::npos) << message;
    EXPECT_NE(message.find("the request is 2.00 MiB more than the larger"), std::string::npos) << message;
    EXPECT_EQ(message.find("fragmentation"), std::string::npos) << message;
  }
  allocator_.free(more);
  allocator_.free(held);
}

// Under a 64 MiB limit on a 256 MiB device, the limit is what refuses: named first, and the
// cache's few free bytes are not called fragmentation.
TEST_F(CachingAllocatorTest, UnderALimitTheOutOfMemoryMessageNamesTheLimitFirst) {
  allocator_.set_limit(64 * MiB);
  void* whole = allocator_.malloc(40 * MiB);
  allocator_.free(whole);
  void* held = allocator_.malloc(36 * MiB);
  void* more = allocator_.malloc(20 * MiB);  // 60 MiB reserved, 4 MiB of it free
  try {
    allocator_.malloc(8 * MiB);
    FAIL() << "8 MiB fitted under the limit";
  } catch (const OutOfMemory& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("of which 196.00 MiB is free. 64.00 MiB allowed; "), std::string::npos)
        << message;
    const std::size_t explained = message.find("stowage: The cap is 64.00 MiB, the allocator's limit;");
    EXPECT_NE(explained, std::string::npos) << message;
    EXPECT_NE(message.find("The cap refused it", explained), std::string::npos) << message;
    EXPECT_EQ(message.find("fragmentation"), std::string::npos) << message;
  }
  allocator_.free(more);
  allocator_.free(held);
}

TEST_F(CachingAllocatorTest, ARequestLargerThanAnythingIsAnOutOfMemoryError) {
  EXPECT_THROW(allocator_.malloc(std::size_t{1} << 63), OutOfMemory);
  EXPECT_THROW(allocator_.malloc(~std::size_t{0}), OutOfMemory);
  EXPECT_EQ(allocator_.stats().num_ooms, 2);
}

TEST_F(CachingAllocatorTest, MisusedFreesAreCountedLoggedAndIgnored) {
  CapturedLog log;
  int local = 0;
  allocator_.free(&local);
  void* block = allocator_.malloc(KiB);
  allocator_.free(block);
  allocator_.free(block);  // double free
  EXPECT_EQ(allocator_.stats().num_invalid_frees, 2);
  ASSERT_EQ(log.lines().size(), 2u);
  EXPECT_NE(log.lines()[0].find("did not allocate or has already freed"), std::string::npos);
  allocator_.check_invariants();
  EXPECT_EQ(allocator_.malloc(KiB), block) << "the cache is intact";
  allocator_.free(block);
}

TEST_F(CachingAllocatorTest, AFreeWithTheWrongSizeKeepsTheAllocation) {
  CapturedLog log;
  void* block = allocator_.malloc(1000);
  allocator_.free(block, 1024);  // the rounded size is not what was asked for
  EXPECT_EQ(allocator_.stats().num_invalid_frees, 1);
  ASSERT_EQ(log.lines().size(), 1u);
  EXPECT_NE(log.lines()[0].find("as 1024 bytes, but it was allocated as 1000 bytes"),
            std::string::npos)
      << log.lines()[0];
  EXPECT_EQ(allocator_.stats().allocated_bytes.all().current, 1024) << "still allocated";
  void* other = allocator_.malloc(1000);
  EXPECT_NE(other, block) << "the kept allocation is not handed out again";
  allocator_.check_invariants();

  allocator_.free(block, 1000);  // the size it was allocated as
  allocator_.free(other);
  EXPECT_EQ(allocator_.stats().num_invalid_frees, 1);
  EXPECT_EQ(allocator_.stats().allocated_bytes.all().current, 0);
  allocator_.free(block, 1000);  // now a double free
  EXPECT_EQ(allocator_.stats().num_invalid_frees, 2);
  allocator_.check_invariants();
}

TEST_F(CachingAllocatorTest, ZeroBytesGiveNullWhichFreeAccepts) {
  EXPECT_EQ(allocator_.malloc(0), nullptr);
  allocator_.free(nullptr);
  EXPECT_EQ(allocator_.stats().num_invalid_frees, 0);
  EXPECT_EQ(allocator_.stats().allocation.all().allocated, 0);
}

class OversizeTest : public CachingAllocatorTest {
 protected:
  OversizeTest() : CachingAllocatorTest(device_of(512 * MiB)) {}
  CachingAllocator oversize_{backend_,
                             parse_allocator_config("max_split_size_mb:64,virtual_memory:off,reserve_headroom:1")};
  void TearDown() override {
    oversize_.check_invariants();
    CachingAllocatorTest::TearDown();
  }
};

TEST_F(OversizeTest, OversizeBlocksAreNeitherSplitNorCarvedUp) {
  void* big = oversize_.malloc(100 * MiB);
  EXPECT_EQ(oversize_.block_size(big), 100 * MiB);
  oversize_.free(big);
  void* medium = oversize_.malloc(10 * MiB);
  EXPECT_NE(medium, big) << "a normal request must not carve up a cached oversize block";
  void* similar = oversize_.malloc(90 * MiB);
  EXPECT_EQ(similar, big) << "an oversize request within 20 MiB reuses it";
  EXPECT_EQ(oversize_.block_size(similar), 100 * MiB) << "without splitting";
  oversize_.free(similar);
  void* much_smaller = oversize_.malloc(70 * MiB);
  EXPECT_NE(much_smaller, big) << "30 MiB of waste is too much";
  const DeviceStats stats = oversize_.stats();
  EXPECT_EQ(stats.oversize_allocations.current, 1);
  EXPECT_EQ(stats.oversize_segments.current, 2);
  EXPECT_EQ(stats.max_split_size, static_cast<std::int64_t>(64 * MiB));
  oversize_.free(medium);
  oversize_.free(much_smaller);
}

TEST_F(OversizeTest, ABlockRoundedUpToTheOversizeClassIsStillReused) {
  // 63 MiB is below max_split_size (64 MiB) but its segment, rounded to 2 MiB, is not: the
  // cached block must serve the same request again instead of a new segment each time.
  for (int i = 0; i < 10; ++i) oversize_.free(oversize_.malloc(63 * MiB));
  EXPECT_EQ(oversize_.stats().reserved_bytes.all().current, static_cast<std::int64_t>(64 * MiB));
}

TEST_F(CachingAllocatorTest, StatsUseTorchNamesAndMeanings) {
  void* a = allocator_.malloc(1000);
  void* b = allocator_.malloc(3 * MiB);
  allocator_.free(a);
  const auto entries = memory_stats_entries(allocator_.stats());
  std::map<std::string, std::int64_t> stats(entries.begin(), entries.end());
  // 9 stats by size class, 3 plain stats, 9 of torch's counters and 7 of stowage's.
  EXPECT_EQ(stats.size(), 9u * 3 * 4 + 3 * 4 + 9 + 7);
  EXPECT_EQ(stats.at("allocation.all.current"), 1);
  EXPECT_EQ(stats.at("allocation.all.allocated"), 2);
  EXPECT_EQ(stats.at("allocation.all.freed"), 1);
  EXPECT_EQ(stats.at("allocation.small_pool.peak"), 1);
  EXPECT_EQ(stats.at("allocated_bytes.large_pool.current"), static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(stats.at("requested_bytes.small_pool.freed"), 1000);
  EXPECT_EQ(stats.at("reserved_bytes.all.current"),
            static_cast<std::int64_t>(2 * MiB + SizePolicy::segment_size(3 * MiB)));
  EXPECT_EQ(stats.at("segment.all.current"), 2);
  EXPECT_EQ(stats.at("inactive_split.large_pool.current"), 1);
  EXPECT_EQ(stats.at("num_device_alloc"), 2);
  EXPECT_EQ(stats.at("num_device_calls"), 2) << "two segments from the device";
  EXPECT_EQ(stats.at("num_steps"), 0);
  EXPECT_EQ(stats.at("max_split_size"), -1);
  EXPECT_TRUE(stats.count("num_invalid_frees"));
  EXPECT_TRUE(stats.count("oversize_segments.freed"));
  allocator_.free(b);
}

TEST_F(CachingAllocatorTest, PeaksAndAccumulatedCountsReset) {
  void* a = allocator_.malloc(4 * MiB);
  void* b = allocator_.malloc(4 * MiB);
  allocator_.free(a);
  EXPECT_EQ(allocator_.stats().allocated_bytes.all().peak, static_cast<std::int64_t>(8 * MiB));
  allocator_.reset_peak_stats();
  EXPECT_EQ(allocator_.stats().allocated_bytes.all().peak, static_cast<std::int64_t>(4 * MiB));
  allocator_.reset_accumulated_stats();
  const DeviceStats stats = allocator_.stats();
  EXPECT_EQ(stats.allocation.all().allocated, 0);
  EXPECT_EQ(stats.allocation.all().freed, 0);
  EXPECT_EQ(stats.allocation.all().current, 1) << "current values survive";
  EXPECT_EQ(stats.num_device_alloc, 0);
  allocator_.free(b);
}

TEST_F(SmallDeviceTest, LimitAndMemoryFractionCapReservedMemory) {
  allocator_.set_limit(8 * MiB);
  EXPECT_EQ(allocator_.limit(), 8 * MiB);
  try {
    allocator_.malloc(10 * MiB);
    FAIL() << "the limit was ignored";
  } catch (const OutOfMemory& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("is free. 8.00 MiB allowed; "), std::string::npos) << message;
    EXPECT_NE(message.find("The request is larger than the cap: raise the allocator's limit"),
              std::string::npos)
        << message;
  }
  allocator_.set_limit(AllocatorConfig::kUnlimited);
  allocator_.set_memory_fraction(0.5);  // as torch's set_per_process_memory_fraction does
  EXPECT_EQ(allocator_.limit(), 32 * MiB);
  EXPECT_EQ(allocator_.limit_bound(), "torch's per-process memory fraction (0.50)");
  void* fits = allocator_.malloc(30 * MiB);
  try {
    allocator_.malloc(10 * MiB);
    FAIL() << "the fraction was ignored";
  } catch (const OutOfMemory& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("stowage: The cap is 32.00 MiB, torch's per-process memory fraction (0.50);"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("The cap refused it"), std::string::npos) << message;
  }
  EXPECT_LE(allocator_.stats().reserved_bytes.all().peak, static_cast<std::int64_t>(32 * MiB));
  EXPECT_THROW(allocator_.set_memory_fraction(-0.1), LogicError);
  EXPECT_THROW(allocator_.set_memory_fraction(1.5), LogicError);
  allocator_.free(fits);
  // Fraction 0 (torch allows it) refuses new memory, and a later fraction lifts that again.
  allocator_.empty_cache();
  allocator_.set_memory_fraction(0);
  EXPECT_EQ(allocator_.limit(), 0u);
  EXPECT_THROW(allocator_.malloc(MiB), OutOfMemory);
  allocator_.set_memory_fraction(0.5);
  EXPECT_DOUBLE_EQ(allocator_.memory_fraction(), 0.5);
  allocator_.free(allocator_.malloc(MiB));
}

TEST_F(CachingAllocatorTest, HistoryRecordsEventsWithContextsAndIsBounded) {
  void* before = allocator_.malloc(KiB);  // not recorded: history is off
  std::uint64_t next_context = 100;
  allocator_.set_context_provider([&] { return next_context++; });
  allocator_.record_history(true);
  void* block = allocator_.malloc(3 * MiB);
  allocator_.free(block);
  allocator_.empty_cache();
  const auto trace = allocator_.snapshot().trace;
  ASSERT_EQ(trace.size(), 5u);
  EXPECT_EQ(trace[0].action, TraceAction::kSegmentAlloc);
  EXPECT_EQ(trace[0].size, SizePolicy::segment_size(3 * MiB));
  EXPECT_EQ(trace[1].action, TraceAction::kAlloc);
  EXPECT_EQ(trace[1].address, address(block));
  EXPECT_EQ(trace[1].size, 3 * MiB);
  EXPECT_EQ(trace[1].context, 100u);
  EXPECT_EQ(trace[2].action, TraceAction::kFreeRequested);
  EXPECT_EQ(trace[2].context, 101u);
  EXPECT_EQ(trace[3].action, TraceAction::kFreeCompleted);
  EXPECT_EQ(trace[4].action, TraceAction::kSegmentFree);
  EXPECT_EQ(trace[4].context, 102u) << "a segment given back carries the stack of the call that gave it";
  EXPECT_LE(trace[0].time_us, trace[4].time_us);
  EXPECT_GT(trace[0].time_us, 0);

  allocator_.record_history(true, 2);
  EXPECT_EQ(allocator_.snapshot().trace.size(), 2u) << "shrinking keeps the newest";
  EXPECT_EQ(allocator_.snapshot().trace.back().action, TraceAction::kSegmentFree);
  allocator_.record_history(false);
  allocator_.free(before);
  EXPECT_TRUE(allocator_.snapshot().trace.empty());
}

TEST_F(CachingAllocatorTest, TheContextProviderRunsWithoutTheAllocatorsLock) {
  // The provider calls back into the allocator: were it called under the lock, this deadlocks.
  allocator_.set_context_provider([this] {
    return static_cast<std::uint64_t>(allocator_.stats().allocation.all().current + 1);
  });
  allocator_.record_history(true);
  void* block = allocator_.malloc(KiB);
  allocator_.free(block);
  EXPECT_EQ(allocator_.snapshot().trace.front().context, 1u);
}

TEST_F(CachingAllocatorTest, SnapshotShowsSegmentsBlocksAndStates) {
  void* a = allocator_.malloc(1000);
  void* b = allocator_.malloc(2000);
  allocator_.free(a);
  const AllocatorSnapshot snapshot = allocator_.snapshot();
  ASSERT_EQ(snapshot.segments.size(), 1u);
  const SegmentSnapshot& segment = snapshot.segments[0];
  EXPECT_EQ(segment.size_class, SizeClass::kSmall);
  EXPECT_EQ(segment.total_size, 2 * MiB);
  EXPECT_EQ(segment.allocated_size, 2048u);
  EXPECT_EQ(segment.requested_size, 2000u);
  ASSERT_EQ(segment.blocks.size(), 3u);
  EXPECT_EQ(segment.blocks[0].state, BlockState::kFree);
  EXPECT_EQ(segment.blocks[1].state, BlockState::kAllocated);
  EXPECT_EQ(segment.blocks[1].address, address(b));
  EXPECT_EQ(segment.blocks[1].requested_size, 2000u);
  EXPECT_EQ(segment.blocks[2].state, BlockState::kFree);
  std::size_t tiled = 0;
  for (const BlockSnapshot& block : segment.blocks) tiled += block.size;
  EXPECT_EQ(tiled, segment.total_size);
  allocator_.free(b);
}

TEST_F(CachingAllocatorTest, ThreadsAllocatingAndFreeingEachOthersBlocks) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::vector<std::vector<void*>> handed(kThreads);
  std::vector<std::mutex> locks(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        void* block = allocator_.malloc(static_cast<std::size_t>(1 + (i * 7919 + t) % 30000));
        {
          std::lock_guard lock(locks[static_cast<std::size_t>((t + 1) % kThreads)]);
          handed[static_cast<std::size_t>((t + 1) % kThreads)].push_back(block);
        }
        std::vector<void*> mine;
        {
          std::lock_guard lock(locks[static_cast<std::size_t>(t)]);
          mine.swap(handed[static_cast<std::size_t>(t)]);
        }
        for (void* other : mine) allocator_.free(other);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& blocks : handed) {
    for (void* block : blocks) allocator_.free(block);
  }
  EXPECT_EQ(allocator_.stats().allocation.all().current, 0);
  EXPECT_EQ(allocator_.stats().num_invalid_frees, 0);
}

TEST(AllocatorConfig, ParsesTheConfigurationString) {
  const AllocatorConfig config =
      parse_allocator_config("max_split_size_mb:128, limit:12GiB,memory_fraction:0.5,"
                             "virtual_memory:off,reserve_headroom:0.1");
  EXPECT_EQ(config.max_split_size, 128 * MiB);
  EXPECT_EQ(config.virtual_memory, VirtualMemoryMode::kOff);
  EXPECT_DOUBLE_EQ(config.reserve_headroom, 0.1);
  const AllocatorConfig again = parse_allocator_config(config.to_string());
  EXPECT_EQ(again.virtual_memory, VirtualMemoryMode::kOff);
  EXPECT_DOUBLE_EQ(again.reserve_headroom, 0.1);
  EXPECT_EQ(parse_allocator_config("virtual_memory:on").virtual_memory, VirtualMemoryMode::kOn);
  EXPECT_EQ(parse_allocator_config("").virtual_memory, VirtualMemoryMode::kAuto);
  EXPECT_EQ(config.limit_bytes, 12 * kGiB);
  EXPECT_DOUBLE_EQ(config.memory_fraction, 0.5);
  EXPECT_EQ(parse_allocator_config(config.to_string()).limit_bytes, config.limit_bytes);
  EXPECT_EQ(parse_allocator_config("").max_split_size, AllocatorConfig::kUnlimited);
}

TEST(AllocatorConfig, RefusesWhatItDoesNotUnderstand) {
  for (const char* bad : {"max_split_size:128", "limit", "limit:12 parsecs", "memory_fraction:2",
                          "limit:1GiB,limit:2GiB", "max_split_size_mb:0",
                          "max_split_size_mb:20", "virtual_memory:yes", "reserve_headroom:-1",
                          "reserve_headroom:2",
                          // 2**44 MiB is 2**64 bytes: it once normalised to 0, then refused as 0
                          "max_split_size_mb:17592186044416", "max_split_size_mb:inf",
                          "max_split_size_mb:nan", "memory_fraction:nan", "move_pages_above:nan"}) {
    EXPECT_THROW(parse_allocator_config(bad), LogicError) << bad;
  }
  try {
    parse_allocator_config("expandable_segment:true");
  } catch (const LogicError& error) {
    EXPECT_NE(std::string(error.what()).find("unknown key 'expandable_segment'"), std::string::npos);
  }
}

TEST(SizePolicyTest, AMediumSegmentHoldsAWholeNumberOfBlocksWithTheLeastWaste) {
  EXPECT_EQ(SizePolicy::segment_size(5 * MiB), 20 * MiB);
  EXPECT_EQ(SizePolicy::segment_size(3 * MiB), 24 * MiB) << "18 and 24 waste nothing: the larger";
  EXPECT_EQ(SizePolicy::segment_size(9 * MiB + 900 * KiB), 20 * MiB);
  EXPECT_EQ(SizePolicy::segment_size(7 * MiB), 22 * MiB) << "three in 22 MiB strand 1 MiB";
  // Every medium size: a 2 MiB multiple in range, wasting no larger a share than a fixed
  // 20 MiB segment would.
  for (std::size_t block = SizePolicy::kSmallRequestMax + 512; block < SizePolicy::kMediumRequestMax;
       block += 4096 + 512) {
    const std::size_t size = SizePolicy::segment_size(block);
    ASSERT_EQ(size % (2 * MiB), 0u) << block;
    ASSERT_GE(size, 16 * MiB) << block;
    ASSERT_LE(size, 24 * MiB) << block;
    const double waste = static_cast<double>(size % block) / static_cast<double>(size);
    const double fixed_waste = static_cast<double>((20 * MiB) % block) / (20.0 * MiB);
    ASSERT_LE(waste, fixed_waste + 1e-12) << block;
  }
}

// Sparing relies on the reserve budget to give the spared segment back when room is short, so
// these use a wide headroom to watch it kept.
constexpr const char* kSparingConfig = "virtual_memory:off,reserve_headroom:0.5";

TEST(SegmentSparingTest, AWholeFreeSegmentIsNotCarvedForASmallRequestWhileTheDeviceHasRoom) {
  HostBackend backend(device_of(1024 * MiB));
  CachingAllocator allocator(backend, parse_allocator_config(kSparingConfig));
  allocator.free(allocator.malloc(300 * MiB));
  // 16 MiB gets its own segment: carving the 300 MiB one would leave its next 290 MiB request
  // without a fit.
  void* small = allocator.malloc(16 * MiB);
  void* big = allocator.malloc(290 * MiB);
  const DeviceStats stats = allocator.stats();
  EXPECT_EQ(stats.num_device_alloc, 2);
  EXPECT_EQ(stats.reserved_bytes.all().peak, static_cast<std::int64_t>(316 * MiB));
  allocator.free(small);
  allocator.free(big);
  allocator.check_invariants();
}

TEST(SegmentSparingTest, WithoutRoomForANewSegmentTheWholeSegmentIsCarved) {
  HostBackend backend(device_of(310 * MiB));
  CachingAllocator allocator(backend, parse_allocator_config(kSparingConfig));
  allocator.free(allocator.malloc(300 * MiB));
  void* small = allocator.malloc(16 * MiB);
  const DeviceStats stats = allocator.stats();
  EXPECT_EQ(stats.num_device_alloc, 1);
  EXPECT_EQ(stats.reserved_bytes.all().current, static_cast<std::int64_t>(300 * MiB));
  allocator.free(small);
  allocator.check_invariants();
}

TEST(SegmentSparingTest, ASegmentCloseToTheRequestOrAlreadySplitIsUsed) {
  HostBackend backend(device_of(1024 * MiB));
  CachingAllocator allocator(backend, parse_allocator_config(kSparingConfig));
  // Less than five times the request: carved as before.
  allocator.free(allocator.malloc(300 * MiB));
  void* sixty_one = allocator.malloc(61 * MiB);
  EXPECT_EQ(allocator.stats().num_device_alloc, 1);
  // The rest of a segment already in use is carved too: the segment is pinned anyway.
  void* sixteen = allocator.malloc(16 * MiB);
  EXPECT_EQ(allocator.stats().num_device_alloc, 1);
  allocator.free(sixty_one);
  allocator.free(sixteen);
  allocator.check_invariants();
}

TEST(SegmentSparingTest, WithReserveHeadroomOneSegmentsAreCarvedAsInPyTorch) {
  HostBackend backend(device_of(1024 * MiB));
  CachingAllocator allocator(backend,
                             parse_allocator_config("virtual_memory:off,reserve_headroom:1"));
  allocator.free(allocator.malloc(300 * MiB));
  void* small = allocator.malloc(16 * MiB);
  EXPECT_EQ(allocator.stats().num_device_alloc, 1);
  allocator.free(small);
  allocator.check_invariants();
}

}  // namespace
}  // namespace stowage

namespace stowage {
namespace {

// Note [Reserve budget]: the default configuration on the segment path.
class SegmentReserveBudgetTest : public ::testing::Test {
 protected:
  SegmentReserveBudgetTest()
      : backend_(device_of(1024 * MiB)),
        allocator_(backend_, parse_allocator_config("virtual_memory:off")) {}
  void TearDown() override { allocator_.check_invariants(); }

  HostBackend backend_;
  CachingAllocator allocator_;
};

TEST_F(SegmentReserveBudgetTest, ACachedSegmentNoRequestFitsGoesBackBeforeANewOneComes) {
  void* first = allocator_.malloc(300 * MiB);
  allocator_.free(first);
  // 400 MiB fits no cached block: the 300 MiB segment is returned rather than kept beside it.
  void* second = allocator_.malloc(400 * MiB);
  const DeviceStats stats = allocator_.stats();
  EXPECT_EQ(stats.reserved_bytes.all().current, static_cast<std::int64_t>(400 * MiB));
  EXPECT_EQ(stats.reserved_bytes.all().peak, static_cast<std::int64_t>(400 * MiB));
  allocator_.free(second);
  // With reserve_headroom:1 both stay, as in PyTorch.
  HostBackend backend(device_of(1024 * MiB));
  CachingAllocator keeps(backend, parse_allocator_config("virtual_memory:off,reserve_headroom:1"));
  keeps.free(keeps.malloc(300 * MiB));
  void* other = keeps.malloc(400 * MiB);
  EXPECT_EQ(keeps.stats().reserved_bytes.all().current, static_cast<std::int64_t>(700 * MiB));
  keeps.free(other);
}

TEST_F(SegmentReserveBudgetTest, ALoopWhoseLayoutChurnsEarnsAllowanceAndStopsCallingTheDevice) {
  // Two phases with sizes that do not fit each other's segments, over and over.
  auto step = [&] {
    std::vector<void*> big;
    for (int i = 0; i < 4; ++i) big.push_back(allocator_.malloc(60 * MiB));
    for (void* block : big) allocator_.free(block);
    std::vector<void*> other;
    for (int i = 0; i < 3; ++i) other.push_back(allocator_.malloc(70 * MiB));
    for (void* block : other) allocator_.free(block);
  };
  for (int i = 0; i < 100; ++i) step();
  const DeviceStats warm = allocator_.stats();
  for (int i = 0; i < 20; ++i) step();
  const DeviceStats later = allocator_.stats();
  EXPECT_EQ(later.num_device_alloc, warm.num_device_alloc);
  EXPECT_EQ(later.num_device_free, warm.num_device_free);
  // Both phases cached by then, and no more.
  EXPECT_LE(later.reserved_bytes.all().peak, static_cast<std::int64_t>(450 * MiB));
}

}  // namespace
}  // namespace stowage
