// The offloader (Note [Offload states]): bytes survive the round trip; device memory is let go only
// after the copy that reads it; buffers come back in reverse order ahead of use, only into free
// memory, and go again under pressure; the allocator's misses wait for offloads; failures lose
// nothing.
#include "offload/offloader.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "base/errors.hpp"
#include "tests/offload/offloader_harness.hpp"
#include "tests/support/gate.hpp"

namespace stowage {
namespace {

using testing::Gate;
using testing::OffloaderHarness;
using testing::OffloaderHarnessOptions;
using testing::pattern;

TEST(Offloader, ABufferOffloadedAndReloadedKeepsItsBytesAndFreesItsMemoryMeanwhile) {
  OffloaderHarness harness;
  HostThreadTimeline compute(harness.backend());
  const std::int64_t baseline = harness.device_allocated();
  std::optional<Offloader::OffloadId> id = harness.offloader().offload(harness.filled(8 * kMiB, 1), compute);
  ASSERT_TRUE(id.has_value());
  harness.offloader().synchronize();
  EXPECT_EQ(harness.offloader().state(*id), OffloadState::kOffloaded);
  EXPECT_EQ(harness.device_allocated(), baseline) << "the device copy is let go once offloaded";
  EXPECT_EQ(harness.offloader().stats().offloaded_bytes.current, as_signed(8 * kMiB));
  const DeviceBuffer back = harness.offloader().reload(*id, compute);
  EXPECT_EQ(harness.offloader().state(*id), OffloadState::kResident);
  EXPECT_EQ(harness.read(back), pattern(8 * kMiB, 1));
  EXPECT_EQ(harness.offloader().reload(*id, compute).data, back.data) << "resident until dropped";
  harness.offloader().drop(*id);
  harness.offloader().check_invariants();
  EXPECT_EQ(harness.offloader().stats().offloaded_bytes.current, 0);
  EXPECT_EQ(harness.engine().pool().stats().allocated_bytes, 0);
}

TEST(Offloader, DeviceMemoryIsHeldUntilTheCopyReadingItCompletes) {
  OffloaderHarness harness;
  HostThreadTimeline compute(harness.backend());
  const std::int64_t baseline = harness.device_allocated();
  Gate gate;  // holds the copy stream
  harness.backend().enqueue_host_function(
      harness.engine().transfers().stream(TransferDirection::kToHost), gate.blocker());
  const auto id = harness.offloader().offload(harness.filled(4 * kMiB, 2), compute);
  harness.offloader().poll();
  EXPECT_EQ(harness.offloader().state(*id), OffloadState::kOffloading);
  EXPECT_EQ(harness.device_allocated(), baseline + as_signed(4 * kMiB))
      << "the source was let go while its copy waits";
  gate.open();
  harness.offloader().synchronize();
  EXPECT_EQ(harness.device_allocated(), baseline);
  EXPECT_EQ(harness.read(harness.offloader().reload(*id, compute)), pattern(4 * kMiB, 2));
  harness.offloader().drop(*id);
}

TEST(Offloader, ATensorFreedWhileItsCopyRunsLeavesNothingBehind) {
  OffloaderHarness harness;
  HostThreadTimeline compute(harness.backend());
  const std::int64_t baseline = harness.device_allocated();
  Gate gate;
  harness.backend().enqueue_host_function(
      harness.engine().transfers().stream(TransferDirection::kToHost), gate.blocker());
  const auto id = harness.offloader().offload(harness.filled(4 * kMiB, 3), compute);
  harness.offloader().drop(*id);  // autograd freed the tensor mid-copy
  harness.offloader().poll();
  EXPECT_EQ(harness.device_allocated(), baseline + as_signed(4 * kMiB))
      << "memory the copy still reads was freed";
  // A new buffer reuses neither the parked device memory nor, before the copy, the host block.
  DeviceBuffer other = harness.filled(4 * kMiB, 4);
  const auto second = harness.offloader().offload(other, compute);
  gate.open();
  harness.offloader().synchronize();
  EXPECT_EQ(harness.read(harness.offloader().reload(*second, compute)), pattern(4 * kMiB, 4));
  harness.offloader().drop(*second);
  other = {};
  harness.offloader().check_invariants();
  EXPECT_EQ(harness.device_allocated(), baseline);
  EXPECT_EQ(harness.engine().pool().stats().allocated_bytes, 0);
}

TEST(Offloader, ABufferStillOffloadingComesBackWithoutACopy) {
  OffloaderHarness harness;
  HostThreadTimeline compute(harness.backend());
  Gate gate;
  harness.backend().enqueue_host_function(
      harness.engine().transfers().stream(TransferDirection::kToHost), gate.blocker());
  DeviceBuffer buffer = harness.filled(2 * kMiB, 5);
  const void* address = buffer.data;
  const auto id = harness.offloader().offload(std::move(buffer), compute);
  const DeviceBuffer back = harness.offloader().reload(*id, compute);  // the copy has not run
  EXPECT_EQ(back.data, address);
  EXPECT_EQ(harness.offloader().stats().num_still_resident, 1);
  EXPECT_EQ(harness.offloader().stats().num_reloads, 0);
  gate.open();
  harness.offloader().synchronize();
  EXPECT_EQ(harness.read(back), pattern(2 * kMiB, 5));
  harness.offloader().drop(*id);
  harness.offloader().check_invariants();
}

TEST(Offloader, BuffersComeBackInReverseOrderAheadOfUse) {
  OffloaderHarnessOptions options;
  options.prefetch = 2;
  OffloaderHarness harness(options);
  HostThreadTimeline compute(harness.backend());
  std::vector<Offloader::OffloadId> ids;
  for (std::uint32_t seed = 0; seed < 6; ++seed) {
    ids.push_back(*harness.offloader().offload(harness.filled(kMiB + seed * 4096, seed), compute));
  }
  harness.offloader().synchronize();
  EXPECT_EQ(harness.read(harness.offloader().reload(ids[5], compute)), pattern(kMiB + 5 * 4096, 5));
  EXPECT_EQ(harness.offloader().state(ids[4]), OffloadState::kReloading);
  EXPECT_EQ(harness.offloader().state(ids[3]), OffloadState::kReloading);
  EXPECT_EQ(harness.offloader().state(ids[2]), OffloadState::kOffloaded) << "beyond two buffers ahead";
  for (std::size_t i = 5; i-- > 0;) {
    EXPECT_EQ(harness.read(harness.offloader().reload(ids[i], compute)),
              pattern(kMiB + i * 4096, static_cast<std::uint32_t>(i)));
    harness.offloader().drop(ids[i + 1]);
    harness.offloader().check_invariants();
  }
  harness.offloader().drop(ids[0]);
  const OffloaderStats stats = harness.offloader().stats();
  EXPECT_EQ(stats.num_reloads, 6);
  EXPECT_EQ(stats.num_prefetched, 5) << "all but the first came back ahead of use";
}

TEST(Offloader, OneBufferAheadMeansOneBeyondTheBufferInUse) {
  OffloaderHarnessOptions options;
  options.prefetch = 1;
  OffloaderHarness harness(options);
  HostThreadTimeline compute(harness.backend());
  std::vector<Offloader::OffloadId> ids;
  for (std::uint32_t seed = 0; seed < 6; ++seed) {
    ids.push_back(*harness.offloader().offload(harness.filled(kMiB, seed), compute));
  }
  harness.offloader().synchronize();
  for (std::size_t i = 6; i-- > 0;) {
    harness.offloader().reload(ids[i], compute);
    if (i > 0) {
      EXPECT_EQ(harness.offloader().state(ids[i - 1]), OffloadState::kReloading)
          << "the buffer after " << i << " comes back while " << i << " is in use";
    }
    harness.offloader().check_invariants();
  }
  EXPECT_EQ(harness.offloader().stats().num_prefetched, 5) << "all but the first came back ahead of use";
  for (const auto id : ids) harness.offloader().drop(id);
}

// One backward on the simulated device: `gaps.size()` buffers of 1 MiB offloaded, then used in
// reverse, `gaps[k]` of compute (a sleep) after the k-th use. Returns the stall it measured.
std::int64_t one_pass_stall_ns(OffloaderHarness& harness, const std::vector<int>& gaps) {
  HostThreadTimeline compute(harness.backend());
  std::vector<Offloader::OffloadId> ids;
  for (std::uint32_t seed = 0; seed < gaps.size(); ++seed) {
    ids.push_back(*harness.offloader().offload(harness.filled(kMiB, seed), compute));
  }
  harness.offloader().synchronize();
  const std::int64_t before = harness.offloader().stats().stall_ns;
  for (std::size_t k = 0; k < gaps.size(); ++k) {
    const auto id = ids[ids.size() - 1 - k];
    harness.offloader().reload(id, compute);  // (not read back: reading is a copy on the link)
    std::this_thread::sleep_for(std::chrono::milliseconds(gaps[k]));
  }
  for (const auto id : ids) harness.offloader().drop(id);
  harness.offloader().synchronize();
  harness.offloader().check_invariants();
  return harness.offloader().stats().stall_ns - before;
}

// Copies of 7.8 ms (1 MiB at 128 MiB/s) behind uneven compute: 50 ms, then three uses 1 ms
// apart, and again. One buffer ahead leaves each short compute a copy to wait for (about 7 ms
// each, 6 a pass); the window measured in the first pass brings the next four during each long
// compute, so from the second pass only the first use waits for its own copy. Stalls here come
// from the link's sleeps, not the machine's speed: a busy machine only lengthens the computes.
TEST(Offloader, TheMeasuredWindowHidesReloadsBehindUnevenCompute) {
  const std::vector<int> gaps = {50, 1, 1, 1, 50, 1, 1, 1, 50, 0};
  const double copy_ns = 1e9 / 128.0;  // 1 MiB at 128 MiB/s
  OffloaderHarnessOptions options;
  options.bandwidth = 128.0 * kMiB;
  OffloaderHarness measured(options);  // prefetch "auto"
  one_pass_stall_ns(measured, gaps);   // measured
  // The least of three pairs of passes: each pass's first copy, and 10 ms a pass for a busy
  // machine's late wake-ups (one buffer ahead waits about 40 ms a pass, every pass; the adaptive
  // lead alone, 40).
  std::int64_t stall = std::numeric_limits<std::int64_t>::max();
  for (int attempt = 0; attempt < 3; ++attempt) {
    stall = std::min(stall, one_pass_stall_ns(measured, gaps) + one_pass_stall_ns(measured, gaps));
  }
  EXPECT_LT(static_cast<double>(stall), 2 * (copy_ns + 10e6)) << "more than each pass's first copy";
  const OffloaderStats stats = measured.offloader().stats();
  EXPECT_GE(stats.window_bytes, static_cast<std::int64_t>(3 * kMiB));
  EXPECT_LE(stats.window_bytes, static_cast<std::int64_t>(6 * kMiB));

  options.prefetch = 1;
  OffloaderHarness one_ahead(options);
  one_pass_stall_ns(one_ahead, gaps);
  const std::int64_t one_ahead_stall = one_pass_stall_ns(one_ahead, gaps) + one_pass_stall_ns(one_ahead, gaps);
  EXPECT_GT(static_cast<double>(one_ahead_stall), 2 * (copy_ns + 6 * 5e6)) << "the pattern needs the window";
}

TEST(Offloader, PrefetchesOnlyIntoMemoryFreeWithoutEviction) {
  OffloaderHarnessOptions options;
  options.prefetch = 4;
  options.room = false;  // the allocator reports no free memory
  OffloaderHarness harness(options);
  HostThreadTimeline compute(harness.backend());
  const auto a = harness.offloader().offload(harness.filled(kMiB, 1), compute);
  const auto b = harness.offloader().offload(harness.filled(kMiB, 2), compute);
  harness.offloader().synchronize();
  harness.offloader().reload(*b, compute);
  EXPECT_EQ(harness.offloader().state(*a), OffloadState::kOffloaded);
  EXPECT_EQ(harness.offloader().stats().num_prefetched, 0);
  harness.offloader().drop(*a);
  harness.offloader().drop(*b);
}

TEST(Offloader, OnAStreamTheComputeWaitsForTheBufferAndTheHostDoesNot) {
  OffloaderHarness harness;
  const Stream stream = harness.backend().create_stream();
  DeviceStreamTimeline compute(harness.backend(), stream);
  const auto id = harness.offloader().offload(harness.filled(4 * kMiB, 9), compute);
  harness.offloader().synchronize();
  Gate gate;  // holds the copy back
  harness.backend().enqueue_host_function(
      harness.engine().transfers().stream(TransferDirection::kToDevice), gate.blocker());
  const DeviceBuffer back = harness.offloader().reload(*id, compute);  // returns at once
  std::vector<std::uint8_t> seen(4 * kMiB);
  harness.backend().copy_async(seen.data(), back.data, seen.size(), stream);  // the use
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the compute reaches its wait
  gate.open();
  harness.backend().synchronize_stream(stream);
  EXPECT_EQ(seen, pattern(4 * kMiB, 9)) << "the compute read the buffer before it came back";
  harness.offloader().synchronize();
  EXPECT_GT(harness.offloader().stats().num_stalls, 0) << "the wait is measured on the device";
  harness.offloader().drop(*id);
  harness.backend().destroy_stream(stream);
}

// Three 16 MiB offloads whose copies run late, then a request of `bytes` made while another
// thread lets the copies run; returns the request's block and the buffers (seeds 0 to 2).
std::pair<void*, std::vector<Offloader::OffloadId>> request_while_offloads_run_late(
    OffloaderHarness& harness, ComputeTimeline& compute, std::size_t bytes) {
  Gate gate;
  harness.backend().enqueue_host_function(
      harness.engine().transfers().stream(TransferDirection::kToHost), gate.blocker());
  std::vector<Offloader::OffloadId> ids;
  for (std::uint32_t seed = 0; seed < 3; ++seed) {
    ids.push_back(*harness.offloader().offload(harness.filled(16 * kMiB, seed), compute));
  }
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate.open();
  });
  void* block = harness.allocator().malloc(bytes);
  opener.join();
  return {block, ids};
}

// Each buffer comes back with its bytes, and goes.
void expect_buffers_back(OffloaderHarness& harness, ComputeTimeline& compute, const std::vector<Offloader::OffloadId>& ids) {
  for (std::size_t i = ids.size(); i-- > 0;) {
    EXPECT_EQ(harness.read(harness.offloader().reload(ids[i], compute)),
              pattern(16 * kMiB, static_cast<std::uint32_t>(i)));
    harness.offloader().drop(ids[i]);
  }
}

TEST(Offloader, AMissWaitsForOffloadsAndGetsTheirMemory) {
  OffloaderHarnessOptions options;
  options.capacity = 64 * kMiB;
  OffloaderHarness harness(options);
  HostThreadTimeline compute(harness.backend());
  const auto [big, ids] = request_while_offloads_run_late(harness, compute, 40 * kMiB);  // fits once two let go
  EXPECT_NE(big, nullptr);
  const OffloaderStats stats = harness.offloader().stats();
  EXPECT_GE(stats.num_pressure_waits, 2);
  EXPECT_GE(stats.pressure_bytes, as_signed(32 * kMiB));
  harness.allocator().free(big);
  expect_buffers_back(harness, compute, ids);
}

TEST(Offloader, ARequestPastTheAllocatedCeilingWaitsForOffloadsThoughTheDeviceHasRoom) {
  OffloaderHarness harness;  // 256 MiB: nothing misses
  HostThreadTimeline compute(harness.backend());
  harness.allocator().set_allocated_ceiling(64 * kMiB);  // the offloads will hold 48 MiB
  const auto [block, ids] = request_while_offloads_run_late(harness, compute, 40 * kMiB);
  EXPECT_LE(harness.device_allocated(), as_signed(64 * kMiB)) << "under the ceiling once two let go";
  EXPECT_GE(harness.offloader().stats().num_pressure_waits, 2);
  harness.allocator().set_allocated_ceiling(CachingAllocator::kNoCeiling);
  harness.allocator().free(block);
  expect_buffers_back(harness, compute, ids);
}

TEST(Offloader, BuffersBackAheadOfUseAreLetGoUnderPressureAndComeBackIntact) {
  OffloaderHarnessOptions options;
  options.prefetch = 2;
  OffloaderHarness harness(options);
  HostThreadTimeline compute(harness.backend());
  std::vector<Offloader::OffloadId> ids;
  for (std::uint32_t seed = 0; seed < 3; ++seed) {
    ids.push_back(*harness.offloader().offload(harness.filled(16 * kMiB, seed), compute));
  }
  harness.offloader().synchronize();
  harness.offloader().reload(ids[2], compute);  // brings ids[1] and ids[0] back ahead: 48 MiB held
  ASSERT_EQ(harness.offloader().state(ids[0]), OffloadState::kReloading);
  harness.allocator().set_allocated_ceiling(56 * kMiB);
  void* block = harness.allocator().malloc(32 * kMiB);  // 24 MiB past the ceiling: both go
  EXPECT_LE(harness.device_allocated(), as_signed(56 * kMiB));
  EXPECT_EQ(harness.offloader().state(ids[0]), OffloadState::kOffloaded);
  EXPECT_EQ(harness.offloader().state(ids[1]), OffloadState::kOffloaded);
  EXPECT_EQ(harness.offloader().stats().num_prefetches_let_go, 2);
  harness.offloader().check_invariants();
  harness.allocator().set_allocated_ceiling(CachingAllocator::kNoCeiling);
  harness.allocator().free(block);
  expect_buffers_back(harness, compute, ids);
  harness.offloader().check_invariants();
}

TEST(Offloader, ADeviceWithoutRoomForABufferLeavesItOffloaded) {
  OffloaderHarnessOptions options;
  options.capacity = 32 * kMiB;
  OffloaderHarness harness(options);
  HostThreadTimeline compute(harness.backend());
  const auto id = harness.offloader().offload(harness.filled(16 * kMiB, 1), compute);
  harness.offloader().synchronize();
  void* hog = harness.allocator().malloc(24 * kMiB);
  EXPECT_THROW(harness.offloader().reload(*id, compute), OutOfMemory);
  EXPECT_EQ(harness.offloader().state(*id), OffloadState::kOffloaded);
  harness.allocator().free(hog);
  EXPECT_EQ(harness.read(harness.offloader().reload(*id, compute)), pattern(16 * kMiB, 1));
  harness.offloader().drop(*id);
  harness.offloader().check_invariants();
}

TEST(Offloader, WithoutHostMemoryTheBufferStaysWithTheCaller) {
  OffloaderHarnessOptions options;
  options.pinned_limit = 4 * kMiB;
  OffloaderHarness harness(options);
  HostThreadTimeline compute(harness.backend());
  EXPECT_FALSE(harness.offloader().offload(harness.filled(8 * kMiB, 1), compute).has_value());
  EXPECT_EQ(harness.offloader().stats().num_host_full, 1);
  harness.offloader().check_invariants();
}

}  // namespace
}  // namespace stowage
