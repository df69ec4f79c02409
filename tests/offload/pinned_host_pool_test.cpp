// The pinned host pool: the allocator's block machinery over page-locked host memory near the
// GPU, its one pinned arena (Note [One pinned arena]), its resident blocks beside the arena and
// its pageable fallback.
#include "offload/pinned_host_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "base/numbers.hpp"
#include "device/host/host_backend.hpp"
#include "device/numa_host_memory.hpp"
#include "tests/support/captured_log.hpp"
#include "tests/support/gate.hpp"

namespace stowage {
namespace {

using testing::CapturedLog;
using testing::Gate;

HostBackendOptions device_options(std::size_t pinned_capacity = 0) {
  HostBackendOptions options;
  options.capacity_bytes = 256 * kMiB;
  options.pinned_capacity_bytes = pinned_capacity;
  return options;
}

std::size_t host_rounded(std::size_t bytes) {
  return round_up(round_up(bytes, 512), NumaHostMemory::page_size());
}

TEST(PinnedHostPool, BlocksAreExactAndTheirSegmentsArePinned) {
  HostBackend backend(device_options());
  PinnedHostPool pool(backend, {});
  const Stream stream = backend.create_stream();
  void* block = pool.allocate(3 * kMiB + 5, stream);
  ASSERT_NE(block, nullptr);
  const PinnedHostPoolStats stats = pool.stats();
  EXPECT_EQ(stats.reserved_bytes, as_signed(host_rounded(3 * kMiB + 5)))
      << "a large block's segment is its size in host pages, not 2 MiB steps";
  EXPECT_EQ(stats.segments.pinned_bytes, host_rounded(3 * kMiB + 5));
  EXPECT_EQ(backend.pinned_bytes(), host_rounded(3 * kMiB + 5)) << "registered with the device";
  EXPECT_EQ(stats.segments.num_pinnings, 1);
  EXPECT_NE(pool.placement().find("anywhere"), std::string::npos) << "a simulated device has no bus";
  pool.free(block);
  pool.check_invariants();
  backend.destroy_stream(stream);
}

TEST(PinnedHostPool, AFreedBlockReturnsOnlyAfterTheCopiesThatUsedIt) {
  HostBackend backend(device_options());
  PinnedHostPool pool(backend, {});
  const Stream out = backend.create_stream();
  const Stream in = backend.create_stream();
  void* first = pool.allocate(4 * kMiB, out);
  Gate gate;
  backend.enqueue_host_function(in, gate.blocker());  // a copy back still reading the block
  pool.record_stream(first, in);
  pool.free(first);
  void* second = pool.allocate(4 * kMiB, out);
  EXPECT_NE(second, first) << "reused while a copy on another stream still uses it";
  pool.free(second);  // freed on its own stream: reusable at once
  EXPECT_EQ(pool.allocate(4 * kMiB, out), second);
  gate.open();
  backend.synchronize_stream(in);
  void* third = pool.allocate(4 * kMiB, out);
  EXPECT_EQ(third, first) << "reused once the copy completed";
  pool.free(second);
  pool.free(third);
  backend.destroy_stream(out);
  backend.destroy_stream(in);
}

// One step: allocates `sizes` in order (forward), frees them in reverse (backward).
void run_step(PinnedHostPool& pool, Stream stream, const std::vector<std::size_t>& sizes) {
  std::vector<void*> blocks;
  for (const std::size_t size : sizes) blocks.push_back(pool.allocate(size, stream));
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) pool.free(*it);
}

TEST(PinnedHostPool, AfterTheLongestStepSettlesNothingMoreIsPinned) {
  HostBackend backend(device_options());
  PinnedHostPool pool(backend, {});
  const Stream stream = backend.create_stream();
  std::mt19937 random(7);
  std::uniform_int_distribution<std::size_t> size(kMiB + 1, 12 * kMiB);
  std::vector<std::size_t> longest(24);
  for (auto& s : longest) s = size(random);
  run_step(pool, stream, longest);
  const std::int64_t peak = pool.stats().peak_allocated_bytes;
  EXPECT_TRUE(pool.settle(stream));
  const PinnedHostPoolStats settled = pool.stats();
  EXPECT_EQ(settled.num_segments, 1);
  EXPECT_EQ(settled.reserved_bytes, as_signed(round_up(static_cast<std::size_t>(peak),
                                                       NumaHostMemory::page_size())));
  for (int step = 0; step < 20; ++step) {
    // Later steps: the same tensors in another order, or fewer and smaller ones.
    std::vector<std::size_t> sizes = longest;
    std::shuffle(sizes.begin(), sizes.end(), random);
    sizes.resize(sizes.size() - static_cast<std::size_t>(step % 5));
    run_step(pool, stream, sizes);
    EXPECT_FALSE(pool.settle(stream)) << "one arena already";
  }
  const PinnedHostPoolStats after = pool.stats();
  EXPECT_EQ(after.segments.num_pinnings, settled.segments.num_pinnings) << "new pinning";
  EXPECT_LE(static_cast<double>(after.peak_reserved_bytes), 1.05 * static_cast<double>(peak))
      << "pinned footprint against the peak of live offloaded bytes";
  pool.check_invariants();
  backend.destroy_stream(stream);
}

TEST(PinnedHostPool, ALongerStepGrowsTheArenaOnce) {
  HostBackend backend(device_options());
  PinnedHostPool pool(backend, {});
  const Stream stream = backend.create_stream();
  run_step(pool, stream, {4 * kMiB, 6 * kMiB});
  EXPECT_TRUE(pool.settle(stream));
  run_step(pool, stream, {4 * kMiB, 6 * kMiB, 8 * kMiB});  // longer: one more segment
  EXPECT_TRUE(pool.settle(stream));
  const std::int64_t pinnings = pool.stats().segments.num_pinnings;
  run_step(pool, stream, {8 * kMiB, 4 * kMiB, 6 * kMiB});
  run_step(pool, stream, {2 * kMiB, 16 * kMiB});
  EXPECT_EQ(pool.stats().segments.num_pinnings, pinnings);
  EXPECT_EQ(pool.stats().reserved_bytes, as_signed(18 * kMiB));
  backend.destroy_stream(stream);
}

TEST(PinnedHostPool, SettleLeavesAPoolInUseAlone) {
  HostBackend backend(device_options());
  PinnedHostPool pool(backend, {});
  const Stream stream = backend.create_stream();
  void* a = pool.allocate(4 * kMiB, stream);
  void* b = pool.allocate(4 * kMiB, stream);
  pool.free(b);
  EXPECT_FALSE(pool.settle(stream)) << "a block is still allocated";
  pool.free(a);
  EXPECT_TRUE(pool.settle(stream));
  backend.destroy_stream(stream);
}

TEST(PinnedHostPool, RefusedPinningFallsBackToPageableMemoryWithOneWarning) {
  HostBackend backend(device_options(/*pinned_capacity=*/4 * kMiB));
  PinnedHostPool pool(backend, {});
  const Stream stream = backend.create_stream();
  CapturedLog log;
  void* pinned = pool.allocate(3 * kMiB, stream);
  void* first = pool.allocate(3 * kMiB, stream);   // past the 4 MiB the host pins
  void* second = pool.allocate(3 * kMiB, stream);
  ASSERT_TRUE(pinned && first && second);
  const PinnedHostPoolStats stats = pool.stats();
  EXPECT_TRUE(stats.segments.pinning_refused);
  EXPECT_EQ(stats.segments.pinned_bytes, host_rounded(3 * kMiB));
  EXPECT_EQ(stats.segments.pageable_bytes, 2 * host_rounded(3 * kMiB));
  ASSERT_EQ(log.lines().size(), 1u) << "one warning, not one per segment";
  EXPECT_NE(log.lines()[0].find("ulimit -l"), std::string::npos) << log.lines()[0];
  // Pageable blocks still carry copies.
  const std::vector<char> data(3 * kMiB, 'x');
  backend.copy_async(first, data.data(), data.size(), stream);
  backend.synchronize_stream(stream);
  EXPECT_EQ(static_cast<char*>(first)[3 * kMiB - 1], 'x');
  for (void* block : {pinned, first, second}) pool.free(block);
  backend.destroy_stream(stream);
}

TEST(PinnedHostPool, PastItsLimitThePoolSaysWhatRanOut) {
  HostBackend backend(device_options());
  PinnedHostPoolOptions options;
  options.limit_bytes = 8 * kMiB;
  PinnedHostPool pool(backend, options);
  const Stream stream = backend.create_stream();
  EXPECT_EQ(pool.try_allocate(10 * kMiB, stream), nullptr);
  try {
    pool.allocate(10 * kMiB, stream);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& error) {
    EXPECT_NE(std::string(error.what()).find("Pinned host memory has a total capacity of 8.00 MiB"),
              std::string::npos)
        << error.what();
  }
  void* fits = pool.allocate(6 * kMiB, stream);
  EXPECT_NE(fits, nullptr);
  pool.free(fits);
  backend.destroy_stream(stream);
}

// Resident blocks: segments of their own, kept through settles, counted in the one limit.

TEST(PinnedHostPool, SettlesWhileResidentBlocksAreHeldAndLeavesThemInPlace) {
  HostBackend backend(device_options());
  PinnedHostPool pool(backend, {});
  const Stream stream = backend.create_stream();
  void* large = pool.allocate_resident(3 * kMiB);
  void* small = pool.allocate_resident(4096);
  std::memset(large, 'L', 3 * kMiB);
  std::memset(small, 's', 4096);
  const PinnedHostPoolStats before = pool.stats();
  EXPECT_EQ(before.resident_allocated_bytes, as_signed(3 * kMiB + 4096));
  EXPECT_EQ(before.allocated_bytes, before.resident_allocated_bytes);
  run_step(pool, stream, {4 * kMiB, 6 * kMiB});
  EXPECT_TRUE(pool.settle(stream)) << "resident blocks do not keep the pool from settling";
  const PinnedHostPoolStats settled = pool.stats();
  EXPECT_EQ(settled.num_settles, 1);
  EXPECT_EQ(settled.resident_reserved_bytes, before.resident_reserved_bytes);
  EXPECT_EQ(settled.reserved_bytes - settled.resident_reserved_bytes, as_signed(10 * kMiB))
      << "the step segments became one arena of the step's peak";
  EXPECT_EQ(static_cast<char*>(large)[3 * kMiB - 1], 'L');
  EXPECT_EQ(static_cast<char*>(small)[4095], 's');
  void* held = pool.allocate(4 * kMiB, stream);
  EXPECT_FALSE(pool.settle(stream)) << "a step block is still allocated";
  pool.free(held);
  pool.free_resident(large);
  pool.free_resident(small);
  const PinnedHostPoolStats freed = pool.stats();
  EXPECT_EQ(freed.resident_allocated_bytes, 0);
  EXPECT_EQ(freed.resident_reserved_bytes, 0) << "a resident segment goes back with its last block";
  EXPECT_EQ(freed.reserved_bytes, as_signed(10 * kMiB));
  pool.check_invariants();
  backend.destroy_stream(stream);
}

TEST(PinnedHostPool, ResidentBlocksNeverLandInTheArena) {
  HostBackend backend(device_options());
  PinnedHostPool pool(backend, {});
  const Stream stream = backend.create_stream();
  run_step(pool, stream, {8 * kMiB, 8 * kMiB});
  ASSERT_TRUE(pool.settle(stream));
  const PinnedHostPoolStats arena = pool.stats();
  ASSERT_EQ(arena.num_segments, 1);
  void* probe = pool.allocate(16 * kMiB, stream);  // the arena's one free range
  const auto* arena_begin = static_cast<const char*>(probe);
  const auto* arena_end = arena_begin + 16 * kMiB;
  pool.free(probe);
  std::vector<void*> resident;
  for (const std::size_t bytes : {std::size_t{4096}, 2 * kMiB, 5 * kMiB}) {
    resident.push_back(pool.allocate_resident(bytes));
    const auto* block = static_cast<const char*>(resident.back());
    EXPECT_TRUE(block + bytes <= arena_begin || block >= arena_end) << "a resident block in the arena";
  }
  const PinnedHostPoolStats after = pool.stats();
  EXPECT_EQ(after.segments.num_pinnings, arena.segments.num_pinnings + 3) << "segments of their own";
  EXPECT_EQ(after.reserved_bytes - after.resident_reserved_bytes, arena.reserved_bytes);
  run_step(pool, stream, {8 * kMiB, 8 * kMiB});  // the step still fits its arena
  EXPECT_EQ(pool.stats().segments.num_pinnings, after.segments.num_pinnings);
  EXPECT_FALSE(pool.settle(stream)) << "one arena already";
  for (void* block : resident) pool.free_resident(block);
  pool.check_invariants();
  backend.destroy_stream(stream);
}

TEST(PinnedHostPool, ItsLimitCountsStepAndResidentBlocks) {
  HostBackend backend(device_options());
  PinnedHostPoolOptions options;
  options.limit_bytes = 16 * kMiB;
  PinnedHostPool pool(backend, options);
  const Stream stream = backend.create_stream();
  void* state = pool.allocate_resident(10 * kMiB);
  EXPECT_EQ(pool.try_allocate(8 * kMiB, stream), nullptr) << "10 MiB resident + 8 MiB > 16 MiB";
  void* page = pool.allocate(4 * kMiB, stream);
  try {
    pool.allocate_resident(4 * kMiB);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& error) {
    EXPECT_NE(std::string(error.what()).find("Pinned host memory has a total capacity of 16.00 MiB"),
              std::string::npos)
        << error.what();
  }
  pool.free_resident(state);  // its segment goes back: room for the steps
  void* larger = pool.allocate(8 * kMiB, stream);
  EXPECT_NE(larger, nullptr);
  EXPECT_LE(pool.stats().peak_reserved_bytes, as_signed(16 * kMiB));
  pool.free(page);
  pool.free(larger);
  pool.check_invariants();
  backend.destroy_stream(stream);
}

TEST(PinnedHostPool, RandomStepsAndResidentBlocksKeepTheInvariants) {
  HostBackend backend(device_options());
  PinnedHostPoolOptions options;
  options.limit_bytes = 160 * kMiB;
  PinnedHostPool pool(backend, options);
  const Stream stream = backend.create_stream();
  std::mt19937 random(11);
  std::uniform_int_distribution<std::size_t> step_size(512, 4 * kMiB);
  std::uniform_int_distribution<std::size_t> resident_size(1, 3 * kMiB);
  std::vector<std::pair<void*, std::size_t>> resident;  // block, bytes (its bytes hold their size's low byte)
  for (int step = 0; step < 40; ++step) {
    if (random() % 3 == 0 && !resident.empty()) {
      const std::size_t victim = random() % resident.size();
      pool.free_resident(resident[victim].first);
      resident.erase(resident.begin() + static_cast<std::ptrdiff_t>(victim));
    }
    if (random() % 2 == 0) {
      const std::size_t bytes = resident_size(random);
      void* block = pool.allocate_resident(bytes);
      std::memset(block, static_cast<int>(bytes & 0xff), bytes);
      resident.emplace_back(block, bytes);
    }
    std::vector<std::size_t> sizes(1 + random() % 12);
    for (auto& size : sizes) size = step_size(random);
    run_step(pool, stream, sizes);
    pool.settle(stream);
    pool.check_invariants();
    const PinnedHostPoolStats stats = pool.stats();
    std::int64_t resident_bytes = 0;
    for (const auto& [block, bytes] : resident) {
      resident_bytes += as_signed(pool.resident_block_size(block));
      const auto* data = static_cast<const unsigned char*>(block);
      ASSERT_EQ(data[0], bytes & 0xff) << "a resident block moved or was overwritten";
      ASSERT_EQ(data[bytes - 1], bytes & 0xff) << "a resident block moved or was overwritten";
    }
    EXPECT_EQ(stats.allocated_bytes, resident_bytes) << "step " << step << ": only resident blocks held";
    EXPECT_EQ(stats.resident_allocated_bytes, resident_bytes);
    EXPECT_EQ(stats.reserved_bytes,
              as_signed(stats.segments.pinned_bytes + stats.segments.pageable_bytes));
    EXPECT_LE(stats.peak_reserved_bytes, as_signed(160 * kMiB)) << "past the one limit";
    EXPECT_GE(stats.peak_reserved_bytes, stats.reserved_bytes);
  }
  EXPECT_GT(pool.stats().num_settles, 0);
  for (const auto& entry : resident) pool.free_resident(entry.first);
  EXPECT_EQ(pool.stats().resident_reserved_bytes, 0);
  pool.check_invariants();
  backend.destroy_stream(stream);
}

}  // namespace
}  // namespace stowage
