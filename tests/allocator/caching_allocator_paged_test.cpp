// The paged path of the CachingAllocator (Note [Paged path]): pages shared by blocks, growth at
// the end of a reservation, stitching of free pages into a new range, release, faults, steady
// state.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "allocator/caching_allocator.hpp"
#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "base/log.hpp"
#include "device/host/host_backend.hpp"
#include "tests/support/quiet_log.hpp"

namespace stowage {
namespace {

constexpr std::size_t MiB = kMiB;
constexpr std::size_t kPage = 2 * MiB;

HostBackendOptions device_of(std::size_t capacity) {
  HostBackendOptions options;
  options.capacity_bytes = capacity;
  options.synchronous = true;
  return options;
}

std::int64_t bytes(std::size_t value) { return static_cast<std::int64_t>(value); }

using testing::QuietLog;

class PagedTest : public ::testing::Test {
 protected:
  explicit PagedTest(std::size_t capacity = 256 * MiB, const char* config = "virtual_memory:on")
      : backend_(device_of(capacity)), allocator_(backend_, parse_allocator_config(config)) {}
  void TearDown() override { allocator_.check_invariants(); }

  DeviceStats stats() const { return allocator_.stats(); }

  HostBackend backend_;
  CachingAllocator allocator_;
};

TEST_F(PagedTest, BlocksSharePagesAndReservedIsThePagesMapped) {
  // Three 3 MiB blocks need 9 MiB: five pages, not three segments of 4 MiB each.
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(allocator_.malloc(3 * MiB));
  EXPECT_EQ(allocator_.block_size(blocks[0]), 3 * MiB);
  EXPECT_EQ(stats().reserved_bytes.all().current, bytes(5 * kPage));
  EXPECT_EQ(stats().mapped_pages.current, 5);
  EXPECT_EQ(backend_.used_bytes(), 5 * kPage);
  // Requests keep their 512 B rounding in the large class.
  void* odd = allocator_.malloc(MiB + 1);
  EXPECT_EQ(allocator_.block_size(odd), MiB + 512);
  allocator_.free(odd);
  for (void* block : blocks) allocator_.free(block);
}

TEST_F(PagedTest, AGrowingRequestExtendsTheReservationInsteadOfLeavingASliver) {
  // A batch that grows by one row each step: each new block starts where the freed one did
  // and only the pages it lacks are mapped.
  std::size_t size = 20 * MiB;
  void* block = allocator_.malloc(size);
  const auto first = reinterpret_cast<std::uintptr_t>(block);
  for (int step = 0; step < 10; ++step) {
    allocator_.free(block);
    size += 300 * 1024;
    block = allocator_.malloc(size);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(block), first) << "step " << step;
    EXPECT_LE(stats().reserved_bytes.all().current, bytes(round_up(size, kPage)))
        << "step " << step;
  }
  allocator_.free(block);
}

class SmallPagedTest : public PagedTest {
 protected:
  SmallPagedTest() : PagedTest(64 * MiB) {}
};

TEST_F(SmallPagedTest, FreePagesAnywhereAreStitchedIntoOneRange) {
  // Fill the device with 4 MiB blocks, free every other one: 32 MiB are free, but in 4 MiB
  // pieces. A 24 MiB request is served from those pages, mapped side by side.
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(allocator_.malloc(4 * MiB));
  EXPECT_THROW(allocator_.malloc(2 * MiB), OutOfMemory);
  for (std::size_t i = 0; i < blocks.size(); i += 2) allocator_.free(blocks[i]);
  const DeviceStats before = stats();
  void* stitched = allocator_.malloc(24 * MiB);
  const DeviceStats after = stats();
  EXPECT_EQ(after.reserved_bytes.all().current, before.reserved_bytes.all().current)
      << "no new memory: the free pages were moved";
  EXPECT_GE(after.num_unmaps - before.num_unmaps, 12);
  EXPECT_EQ(after.num_device_alloc, before.num_device_alloc);
  // The stitched range is usable throughout.
  std::memset(stitched, 0x5A, 24 * MiB);
  EXPECT_EQ(static_cast<unsigned char*>(stitched)[24 * MiB - 1], 0x5A);
  allocator_.free(stitched);
  for (std::size_t i = 1; i < blocks.size(); i += 2) allocator_.free(blocks[i]);
}

TEST_F(SmallPagedTest, LiveDataStaysIntactWhileOtherPagesMove) {
  std::vector<void*> keep;
  std::vector<void*> drop;
  for (int i = 0; i < 8; ++i) {
    keep.push_back(allocator_.malloc(3 * MiB + 4096));
    std::memset(keep.back(), i + 1, 3 * MiB + 4096);
    drop.push_back(allocator_.malloc(3 * MiB));
  }
  for (void* block : drop) allocator_.free(block);
  void* big = allocator_.malloc(20 * MiB);
  std::memset(big, 0xFF, 20 * MiB);
  for (int i = 0; i < 8; ++i) {
    const auto* data = static_cast<const unsigned char*>(keep[static_cast<std::size_t>(i)]);
    for (std::size_t offset = 0; offset < 3 * MiB + 4096; offset += 4096) {
      ASSERT_EQ(data[offset], i + 1) << "block " << i << " offset " << offset;
    }
  }
  allocator_.free(big);
  for (void* block : keep) allocator_.free(block);
}

constexpr BackendCall kPagedCalls[] = {BackendCall::kCreatePhysical, BackendCall::kMap,
                                       BackendCall::kSetAccess, BackendCall::kReserve};

TEST_F(SmallPagedTest, AFailingCreateMapOrSetAccessIsACleanOutOfMemory) {
  QuietLog quiet;
  for (const BackendCall call : kPagedCalls) {
    for (std::uint64_t n = 1; n <= 64; ++n) backend_.faults().fail_nth(call, n);
    // 40 MiB on an empty 64 MiB device: only the failing device can refuse it, and the
    // message says so rather than blaming live blocks.
    try {
      allocator_.malloc(40 * MiB);
      ADD_FAILURE() << "no OutOfMemory with " << backend_call_name(call) << " failing";
    } catch (const OutOfMemory& error) {
      EXPECT_NE(std::string(error.what()).find("reports room for it but refused"),
                std::string::npos)
          << error.what();
    }
    backend_.faults().clear();
    allocator_.check_invariants();
    EXPECT_EQ(backend_.used_bytes(), static_cast<std::size_t>(stats().reserved_bytes.all().current))
        << "a page created for the failed request was lost (" << backend_call_name(call) << ")";
    void* block = allocator_.malloc(40 * MiB);
    allocator_.free(block);
    allocator_.empty_cache();
    EXPECT_EQ(backend_.used_bytes(), 0u);
  }
}

TEST_F(SmallPagedTest, AOneOffDeviceFailureIsRetried) {
  QuietLog quiet;
  for (const BackendCall call : kPagedCalls) {
    backend_.faults().fail_nth(call, 1);
    void* block = allocator_.malloc(40 * MiB);
    EXPECT_NE(block, nullptr) << backend_call_name(call);
    allocator_.check_invariants();
    allocator_.free(block);
    allocator_.empty_cache();
    EXPECT_EQ(backend_.used_bytes(), 0u) << backend_call_name(call);
  }
  EXPECT_GE(stats().num_alloc_retries, 4);
}

TEST_F(SmallPagedTest, AFailedUnmapLeavesTheCacheAsItWas) {
  QuietLog quiet;
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(allocator_.malloc(4 * MiB));
  for (std::size_t i = 0; i < blocks.size(); i += 2) allocator_.free(blocks[i]);
  for (std::uint64_t n = 1; n <= 64; ++n) backend_.faults().fail_nth(BackendCall::kUnmap, n);
  EXPECT_THROW(allocator_.malloc(24 * MiB), OutOfMemory) << "no page could be moved";
  backend_.faults().clear();
  allocator_.check_invariants();
  void* stitched = allocator_.malloc(24 * MiB);
  allocator_.free(stitched);
  for (std::size_t i = 1; i < blocks.size(); i += 2) allocator_.free(blocks[i]);
}

TEST(PagedOversize, AnOversizeFreeBlockIsNeitherHandedOutWholeNorCarved) {
  HostBackend backend(device_of(256 * MiB));
  CachingAllocator allocator(backend,
                             parse_allocator_config("virtual_memory:on,max_split_size_mb:40"));
  void* big = allocator.malloc(100 * MiB);
  allocator.free(big);
  // Too much bigger to be reused for 50 MiB; the new pages must not join it either.
  void* oversize = allocator.malloc(50 * MiB);
  EXPECT_EQ(allocator.block_size(oversize), 50 * MiB);
  EXPECT_EQ(allocator.stats().allocated_bytes.all().current, bytes(50 * MiB));
  // Small requests beside it do not carve it, and still find memory under a limit.
  allocator.set_limit(200 * MiB);
  std::vector<void*> small;
  for (int i = 0; i < 15; ++i) small.push_back(allocator.malloc(5 * MiB));
  for (void* block : small) allocator.free(block);
  allocator.free(oversize);
  allocator.check_invariants();
}

TEST(PagedStitching, TheFreeBlockAfterTheChosenHoleCanGiveItsPages) {
  // A hole in the middle of the range, followed by free cache: the request needs that cache's
  // pages, and gets them.
  HostBackend backend(device_of(256 * MiB));
  CachingAllocator allocator(backend, parse_allocator_config("virtual_memory:on,limit:48MiB"));
  const Stream other = backend.create_stream();
  void* x = allocator.malloc(20 * MiB);
  void* y = allocator.malloc(12 * MiB);
  void* c = allocator.malloc(4 * MiB);
  allocator.free(x);
  void* z = allocator.malloc(20 * MiB, other);  // moves x's pages: a hole where x was
  allocator.free(y);                             // 12 MiB of cache right after the hole
  void* w = nullptr;
  EXPECT_NO_THROW(w = allocator.malloc(20 * MiB));
  allocator.check_invariants();
  allocator.free(w);
  allocator.free(z);
  allocator.free(c);
}

TEST(PagedStitching, PagesMovedWithAnOversizeClassLeaveCacheTheCacheCanUse) {
  // Surplus pages mapped after a request stay below the oversize class, so later small
  // requests use them instead of moving the same pages again and again.
  HostBackend backend(device_of(1024 * MiB));
  CachingAllocator allocator(
      backend, parse_allocator_config("virtual_memory:on,max_split_size_mb:24,reserve_headroom:0"));
  const Stream other = backend.create_stream();
  allocator.free(allocator.malloc(60 * MiB, other));
  std::vector<void*> blocks;
  for (int i = 0; i < 12; ++i) blocks.push_back(allocator.malloc(3 * MiB));
  EXPECT_LE(allocator.stats().num_unmaps, 30) << "the 60 MiB block's pages moved once";
  for (void* block : blocks) allocator.free(block);
  allocator.check_invariants();
}

TEST(PagedStitching, ASmallRequestMovesAFewPagesNotAWholeHugeBlock) {
  HostBackend backend(device_of(2048 * MiB));
  CachingAllocator allocator(
      backend, parse_allocator_config("virtual_memory:on,reserve_headroom:0,move_pages_above:0"));
  const Stream other = backend.create_stream();
  allocator.free(allocator.malloc(1024 * MiB, other));
  const DeviceStats before = allocator.stats();
  void* block = allocator.malloc(2 * MiB);
  const DeviceStats after = allocator.stats();
  EXPECT_GE(after.num_unmaps - before.num_unmaps, 1);
  EXPECT_LE(after.num_unmaps - before.num_unmaps, 16) << "at most 16 times the pages missing";
  allocator.free(block);
  allocator.check_invariants();
}

TEST(PagedFaults, PagesThatNeitherUnmapNorBecomeAccessibleAreSetAsideNotReused) {
  QuietLog quiet;
  HostBackend backend(device_of(256 * MiB));
  CachingAllocator allocator(backend, parse_allocator_config("virtual_memory:on"));
  backend.faults().fail_nth(BackendCall::kSetAccess, 1);
  backend.faults().fail_nth(BackendCall::kSetAccess, 2);
  for (std::uint64_t n = 1; n <= 3; ++n) backend.faults().fail_nth(BackendCall::kUnmap, n);
  void* first = allocator.malloc(4 * MiB);  // served from a fresh range on the retry
  backend.faults().clear();
  for (int i = 0; i < 3; ++i) {
    void* block = allocator.malloc(4 * MiB);
    std::memset(block, i, 4 * MiB);
    allocator.free(block);
  }
  allocator.free(first);
  allocator.check_invariants();
  allocator.empty_cache();  // unmaps the set-aside range now that the device cooperates
  EXPECT_EQ(backend.used_bytes(), 0u);
  EXPECT_EQ(allocator.stats().segment.all().current, 0);
}

TEST_F(PagedTest, EmptyCacheReturnsEveryFreePageAndReservation) {
  void* live = allocator_.malloc(5 * MiB);
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < 10; ++i) blocks.push_back(allocator_.malloc(7 * MiB + 512 * i));
  void* small = allocator_.malloc(1000, backend_.create_stream());
  for (void* block : blocks) allocator_.free(block);
  allocator_.free(small);
  allocator_.empty_cache();
  // Only the pages under the live block stay.
  EXPECT_EQ(stats().reserved_bytes.all().current, bytes(3 * kPage));
  EXPECT_EQ(backend_.used_bytes(), 3 * kPage);
  EXPECT_EQ(stats().segment.all().current, 1) << "the small class's reservation went back";
  allocator_.free(live);
  allocator_.empty_cache();
  EXPECT_EQ(stats().reserved_bytes.all().current, 0);
  EXPECT_EQ(stats().segment.all().current, 0);
  EXPECT_EQ(backend_.used_bytes(), 0u);
}

TEST_F(PagedTest, SnapshotReportsEachRunOfMappedPagesTiledByItsBlocks) {
  void* a = allocator_.malloc(3 * MiB);
  void* b = allocator_.malloc(5 * MiB);
  allocator_.free(a);
  const AllocatorSnapshot shot = allocator_.snapshot();
  ASSERT_EQ(shot.segments.size(), 1u);
  const SegmentSnapshot& segment = shot.segments[0];
  EXPECT_EQ(segment.total_size, 4 * kPage);
  std::size_t tiled = 0;
  for (const BlockSnapshot& block : segment.blocks) tiled += block.size;
  EXPECT_EQ(tiled, segment.total_size);
  EXPECT_EQ(segment.allocated_size, 5 * MiB);
  allocator_.free(b);
}

TEST(PagedConfig, TheSegmentPathStaysSelectable) {
  HostBackend backend(device_of(64 * MiB));
  CachingAllocator segments(backend, parse_allocator_config("virtual_memory:off"));
  void* block = segments.malloc(3 * MiB);
  EXPECT_EQ(segments.stats().mapped_pages.current, 0);
  EXPECT_EQ(segments.stats().reserved_bytes.all().current, bytes(SizePolicy::segment_size(3 * MiB))) << "a medium segment";
  segments.free(block);
}

// One synthetic training step: persistent weights, activations of many sizes kept for the
// backward pass and freed in reverse, gradients and temporaries in between.
struct SyntheticStep {
  std::vector<std::size_t> activation_sizes;
  std::vector<std::size_t> gradient_sizes;

  explicit SyntheticStep(std::uint64_t seed) {
    std::mt19937_64 random(seed);
    std::uniform_int_distribution<std::size_t> size(1, 24 * MiB);
    for (int i = 0; i < 60; ++i) activation_sizes.push_back(size(random));
    for (int i = 0; i < 20; ++i) gradient_sizes.push_back(size(random) / 2 + 1);
  }

  void run(CachingAllocator& allocator, std::vector<void*>& gradients) const {
    std::vector<void*> saved;
    for (std::size_t i = 0; i < activation_sizes.size(); ++i) {
      void* temporary = allocator.malloc(activation_sizes[i] / 3 + 1);
      saved.push_back(allocator.malloc(activation_sizes[i]));
      allocator.free(temporary);
    }
    for (std::size_t i = saved.size(); i-- > 0;) {
      void* grad_input = allocator.malloc(activation_sizes[i]);
      if (i % 3 == 0) {
        const std::size_t g = (i / 3) % gradient_sizes.size();
        if (gradients[g] == nullptr) gradients[g] = allocator.malloc(gradient_sizes[g]);
      }
      allocator.free(saved[i]);
      allocator.free(grad_input);
    }
  }
};

class StepTest : public PagedTest {
 protected:
  // Room for the synthetic step below (about 700 MiB at its peak).
  StepTest() : PagedTest(1024 * MiB) {}
};

TEST_F(StepTest, IdenticalStepsMakeNoMapOrUnmapCallsOnceWarm) {
  std::vector<void*> weights;
  for (std::size_t i = 0; i < 12; ++i) weights.push_back(allocator_.malloc((i + 1) * 700 * 1024));
  const SyntheticStep step(7);
  std::vector<void*> gradients(step.gradient_sizes.size(), nullptr);
  // Warm-up: the first steps move pages; each time they have moved an eighth of the working set
  // without it growing, the reserve may grow by 1%, until the layout settles.
  for (int warm = 0; warm < 200; ++warm) step.run(allocator_, gradients);
  const DeviceStats warm = stats();
  for (int i = 0; i < 20; ++i) step.run(allocator_, gradients);
  const DeviceStats later = stats();
  EXPECT_EQ(later.num_maps, warm.num_maps);
  EXPECT_EQ(later.num_unmaps, warm.num_unmaps);
  EXPECT_EQ(later.reserved_bytes.all().peak, warm.reserved_bytes.all().peak);
  for (void* block : gradients) allocator_.free(block);
  for (void* block : weights) allocator_.free(block);
}

TEST_F(PagedTest, PagesMoveAcrossStreamsAfterTheOwnerStreamIsWaitedFor) {
  HostBackendOptions options = device_of(64 * MiB);
  options.synchronous = false;
  HostBackend backend(options);
  // Pages move before new ones are made (no room spent, no headroom), to watch the move.
  CachingAllocator allocator(
      backend, parse_allocator_config("virtual_memory:on,move_pages_above:0,reserve_headroom:0"));
  const Stream other = backend.create_stream();
  void* on_other = allocator.malloc(48 * MiB, other);
  allocator.free(on_other);
  // The pages of the free block of `other` are the only memory left: they move.
  void* here = allocator.malloc(48 * MiB);
  EXPECT_GT(allocator.stats().num_unmaps, 0);
  EXPECT_EQ(allocator.stats().reserved_bytes.all().peak, bytes(48 * MiB));
  allocator.free(here);
  allocator.check_invariants();
  backend.destroy_stream(other);
}

TEST_F(PagedTest, MappingsStayBoundedByTheReserve) {
  std::mt19937_64 random(3);
  std::uniform_int_distribution<std::size_t> size(1, 16 * MiB);
  std::vector<void*> live;
  for (int i = 0; i < 5000; ++i) {
    if (live.size() < 12 && random() % 2 == 0) {
      live.push_back(allocator_.malloc(size(random)));
    } else if (!live.empty()) {
      const std::size_t index = random() % live.size();
      allocator_.free(live[index]);
      live[index] = live.back();
      live.pop_back();
    }
    const DeviceStats now = stats();
    ASSERT_EQ(now.mapped_pages.current * static_cast<std::int64_t>(kPage),
              now.reserved_bytes.all().current);
  }
  EXPECT_LE(stats().mapped_pages.peak, bytes(256 * MiB / kPage));
  for (void* block : live) allocator_.free(block);
}

}  // namespace
}  // namespace stowage
