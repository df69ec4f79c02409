// The pager (Note [Page states]): bytes survive the round trip; device memory is let go only
// after the copy that reads it; pages come back in reverse order ahead of use, only into free
// memory, and go again under pressure; the allocator's misses wait for page-outs; failures lose
// nothing.
#include "offload/pager.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "allocator/base/errors.hpp"
#include "tests/offload/pager_harness.hpp"
#include "tests/support/gate.hpp"

namespace stowage {
namespace {

using testing::Gate;
using testing::PagerHarness;
using testing::PagerHarnessOptions;
using testing::pattern;

TEST(Pager, ABufferPagedOutAndBackKeepsItsBytesAndFreesItsMemoryMeanwhile) {
  PagerHarness harness;
  HostThreadTimeline compute(harness.backend());
  const std::int64_t baseline = harness.device_allocated();
  std::optional<Pager::PageId> id = harness.pager().page_out(harness.filled(8 * kMiB, 1), compute);
  ASSERT_TRUE(id.has_value());
  harness.pager().synchronize();
  EXPECT_EQ(harness.pager().state(*id), PageState::kOffloaded);
  EXPECT_EQ(harness.device_allocated(), baseline) << "the device copy is let go once paged out";
  EXPECT_EQ(harness.pager().stats().offloaded_bytes.current, as_signed(8 * kMiB));
  const DeviceBuffer back = harness.pager().page_in(*id, compute);
  EXPECT_EQ(harness.pager().state(*id), PageState::kResident);
  EXPECT_EQ(harness.read(back), pattern(8 * kMiB, 1));
  EXPECT_EQ(harness.pager().page_in(*id, compute).data, back.data) << "resident until dropped";
  harness.pager().drop(*id);
  harness.pager().check_invariants();
  EXPECT_EQ(harness.pager().stats().offloaded_bytes.current, 0);
  EXPECT_EQ(harness.engine().pool().stats().allocated_bytes, 0);
}

TEST(Pager, DeviceMemoryIsHeldUntilTheCopyReadingItCompletes) {
  PagerHarness harness;
  HostThreadTimeline compute(harness.backend());
  const std::int64_t baseline = harness.device_allocated();
  Gate gate;  // holds the copy stream
  harness.backend().enqueue_host_function(
      harness.engine().transfers().stream(TransferDirection::kToHost), gate.blocker());
  const auto id = harness.pager().page_out(harness.filled(4 * kMiB, 2), compute);
  harness.pager().poll();
  EXPECT_EQ(harness.pager().state(*id), PageState::kPagingOut);
  EXPECT_EQ(harness.device_allocated(), baseline + as_signed(4 * kMiB))
      << "the source was let go while its copy waits";
  gate.open();
  harness.pager().synchronize();
  EXPECT_EQ(harness.device_allocated(), baseline);
  EXPECT_EQ(harness.read(harness.pager().page_in(*id, compute)), pattern(4 * kMiB, 2));
  harness.pager().drop(*id);
}

TEST(Pager, ATensorFreedWhileItsCopyRunsLeavesNothingBehind) {
  PagerHarness harness;
  HostThreadTimeline compute(harness.backend());
  const std::int64_t baseline = harness.device_allocated();
  Gate gate;
  harness.backend().enqueue_host_function(
      harness.engine().transfers().stream(TransferDirection::kToHost), gate.blocker());
  const auto id = harness.pager().page_out(harness.filled(4 * kMiB, 3), compute);
  harness.pager().drop(*id);  // autograd freed the tensor mid-copy
  harness.pager().poll();
  EXPECT_EQ(harness.device_allocated(), baseline + as_signed(4 * kMiB))
      << "memory the copy still reads was freed";
  // A new page reuses neither the parked device memory nor, before the copy, the host block.
  DeviceBuffer other = harness.filled(4 * kMiB, 4);
  const auto second = harness.pager().page_out(other, compute);
  gate.open();
  harness.pager().synchronize();
  EXPECT_EQ(harness.read(harness.pager().page_in(*second, compute)), pattern(4 * kMiB, 4));
  harness.pager().drop(*second);
  other = {};
  harness.pager().check_invariants();
  EXPECT_EQ(harness.device_allocated(), baseline);
  EXPECT_EQ(harness.engine().pool().stats().allocated_bytes, 0);
}

TEST(Pager, APageStillPagingOutComesBackWithoutACopy) {
  PagerHarness harness;
  HostThreadTimeline compute(harness.backend());
  Gate gate;
  harness.backend().enqueue_host_function(
      harness.engine().transfers().stream(TransferDirection::kToHost), gate.blocker());
  DeviceBuffer buffer = harness.filled(2 * kMiB, 5);
  const void* address = buffer.data;
  const auto id = harness.pager().page_out(std::move(buffer), compute);
  const DeviceBuffer back = harness.pager().page_in(*id, compute);  // the copy has not run
  EXPECT_EQ(back.data, address);
  EXPECT_EQ(harness.pager().stats().num_still_resident, 1);
  EXPECT_EQ(harness.pager().stats().num_page_ins, 0);
  gate.open();
  harness.pager().synchronize();
  EXPECT_EQ(harness.read(back), pattern(2 * kMiB, 5));
  harness.pager().drop(*id);
  harness.pager().check_invariants();
}

TEST(Pager, PagesComeBackInReverseOrderAheadOfUse) {
  PagerHarnessOptions options;
  options.prefetch = 2;
  PagerHarness harness(options);
  HostThreadTimeline compute(harness.backend());
  std::vector<Pager::PageId> ids;
  for (std::uint32_t seed = 0; seed < 6; ++seed) {
    ids.push_back(*harness.pager().page_out(harness.filled(kMiB + seed * 4096, seed), compute));
  }
  harness.pager().synchronize();
  EXPECT_EQ(harness.read(harness.pager().page_in(ids[5], compute)), pattern(kMiB + 5 * 4096, 5));
  EXPECT_EQ(harness.pager().state(ids[4]), PageState::kPagingIn);
  EXPECT_EQ(harness.pager().state(ids[3]), PageState::kPagingIn);
  EXPECT_EQ(harness.pager().state(ids[2]), PageState::kOffloaded) << "beyond two pages ahead";
  for (std::size_t i = 5; i-- > 0;) {
    EXPECT_EQ(harness.read(harness.pager().page_in(ids[i], compute)),
              pattern(kMiB + i * 4096, static_cast<std::uint32_t>(i)));
    harness.pager().drop(ids[i + 1]);
    harness.pager().check_invariants();
  }
  harness.pager().drop(ids[0]);
  const PagerStats stats = harness.pager().stats();
  EXPECT_EQ(stats.num_page_ins, 6);
  EXPECT_EQ(stats.num_prefetched, 5) << "all but the first came back ahead of use";
}

TEST(Pager, PrefetchesOnlyIntoMemoryFreeWithoutEviction) {
  PagerHarnessOptions options;
  options.prefetch = 4;
  options.room = false;  // the allocator reports no free memory
  PagerHarness harness(options);
  HostThreadTimeline compute(harness.backend());
  const auto a = harness.pager().page_out(harness.filled(kMiB, 1), compute);
  const auto b = harness.pager().page_out(harness.filled(kMiB, 2), compute);
  harness.pager().synchronize();
  harness.pager().page_in(*b, compute);
  EXPECT_EQ(harness.pager().state(*a), PageState::kOffloaded);
  EXPECT_EQ(harness.pager().stats().num_prefetched, 0);
  harness.pager().drop(*a);
  harness.pager().drop(*b);
}

TEST(Pager, OnAStreamTheComputeWaitsForThePageAndTheHostDoesNot) {
  PagerHarness harness;
  const Stream stream = harness.backend().create_stream();
  DeviceStreamTimeline compute(harness.backend(), stream);
  const auto id = harness.pager().page_out(harness.filled(4 * kMiB, 9), compute);
  harness.pager().synchronize();
  Gate gate;  // holds the copy back
  harness.backend().enqueue_host_function(
      harness.engine().transfers().stream(TransferDirection::kToDevice), gate.blocker());
  const DeviceBuffer back = harness.pager().page_in(*id, compute);  // returns at once
  std::vector<std::uint8_t> seen(4 * kMiB);
  harness.backend().copy_async(seen.data(), back.data, seen.size(), stream);  // the use
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the compute reaches its wait
  gate.open();
  harness.backend().synchronize_stream(stream);
  EXPECT_EQ(seen, pattern(4 * kMiB, 9)) << "the compute read the page before it came back";
  harness.pager().synchronize();
  EXPECT_GT(harness.pager().stats().num_stalls, 0) << "the wait is measured on the device";
  harness.pager().drop(*id);
  harness.backend().destroy_stream(stream);
}

// Three 16 MiB page-outs whose copies run late, then a request of `bytes` made while another
// thread lets the copies run; returns the request's block and the pages (seeds 0 to 2).
std::pair<void*, std::vector<Pager::PageId>> request_while_page_outs_run_late(
    PagerHarness& harness, ComputeTimeline& compute, std::size_t bytes) {
  Gate gate;
  harness.backend().enqueue_host_function(
      harness.engine().transfers().stream(TransferDirection::kToHost), gate.blocker());
  std::vector<Pager::PageId> ids;
  for (std::uint32_t seed = 0; seed < 3; ++seed) {
    ids.push_back(*harness.pager().page_out(harness.filled(16 * kMiB, seed), compute));
  }
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate.open();
  });
  void* block = harness.allocator().malloc(bytes);
  opener.join();
  return {block, ids};
}

// Each page comes back with its bytes, and goes.
void expect_pages_back(PagerHarness& harness, ComputeTimeline& compute, const std::vector<Pager::PageId>& ids) {
  for (std::size_t i = ids.size(); i-- > 0;) {
    EXPECT_EQ(harness.read(harness.pager().page_in(ids[i], compute)),
              pattern(16 * kMiB, static_cast<std::uint32_t>(i)));
    harness.pager().drop(ids[i]);
  }
}

TEST(Pager, AMissWaitsForPageOutsAndGetsTheirMemory) {
  PagerHarnessOptions options;
  options.capacity = 64 * kMiB;
  PagerHarness harness(options);
  HostThreadTimeline compute(harness.backend());
  const auto [big, ids] = request_while_page_outs_run_late(harness, compute, 40 * kMiB);  // fits once two let go
  EXPECT_NE(big, nullptr);
  const PagerStats stats = harness.pager().stats();
  EXPECT_GE(stats.num_pressure_waits, 2);
  EXPECT_GE(stats.pressure_bytes, as_signed(32 * kMiB));
  harness.allocator().free(big);
  expect_pages_back(harness, compute, ids);
}

TEST(Pager, ARequestPastTheAllocatedCeilingWaitsForPageOutsThoughTheDeviceHasRoom) {
  PagerHarness harness;  // 256 MiB: nothing misses
  HostThreadTimeline compute(harness.backend());
  harness.allocator().set_allocated_ceiling(64 * kMiB);  // the page-outs will hold 48 MiB
  const auto [block, ids] = request_while_page_outs_run_late(harness, compute, 40 * kMiB);
  EXPECT_LE(harness.device_allocated(), as_signed(64 * kMiB)) << "under the ceiling once two let go";
  EXPECT_GE(harness.pager().stats().num_pressure_waits, 2);
  harness.allocator().set_allocated_ceiling(CachingAllocator::kNoCeiling);
  harness.allocator().free(block);
  expect_pages_back(harness, compute, ids);
}

TEST(Pager, PagesBackAheadOfUseAreLetGoUnderPressureAndComeBackIntact) {
  PagerHarnessOptions options;
  options.prefetch = 2;
  PagerHarness harness(options);
  HostThreadTimeline compute(harness.backend());
  std::vector<Pager::PageId> ids;
  for (std::uint32_t seed = 0; seed < 3; ++seed) {
    ids.push_back(*harness.pager().page_out(harness.filled(16 * kMiB, seed), compute));
  }
  harness.pager().synchronize();
  harness.pager().page_in(ids[2], compute);  // brings ids[1] and ids[0] back ahead: 48 MiB held
  ASSERT_EQ(harness.pager().state(ids[0]), PageState::kPagingIn);
  harness.allocator().set_allocated_ceiling(56 * kMiB);
  void* block = harness.allocator().malloc(32 * kMiB);  // 24 MiB past the ceiling: both go
  EXPECT_LE(harness.device_allocated(), as_signed(56 * kMiB));
  EXPECT_EQ(harness.pager().state(ids[0]), PageState::kOffloaded);
  EXPECT_EQ(harness.pager().state(ids[1]), PageState::kOffloaded);
  EXPECT_EQ(harness.pager().stats().num_prefetches_let_go, 2);
  harness.pager().check_invariants();
  harness.allocator().set_allocated_ceiling(CachingAllocator::kNoCeiling);
  harness.allocator().free(block);
  expect_pages_back(harness, compute, ids);
  harness.pager().check_invariants();
}

TEST(Pager, ADeviceWithoutRoomForAPageLeavesItOffloaded) {
  PagerHarnessOptions options;
  options.capacity = 32 * kMiB;
  PagerHarness harness(options);
  HostThreadTimeline compute(harness.backend());
  const auto id = harness.pager().page_out(harness.filled(16 * kMiB, 1), compute);
  harness.pager().synchronize();
  void* hog = harness.allocator().malloc(24 * kMiB);
  EXPECT_THROW(harness.pager().page_in(*id, compute), OutOfMemory);
  EXPECT_EQ(harness.pager().state(*id), PageState::kOffloaded);
  harness.allocator().free(hog);
  EXPECT_EQ(harness.read(harness.pager().page_in(*id, compute)), pattern(16 * kMiB, 1));
  harness.pager().drop(*id);
  harness.pager().check_invariants();
}

TEST(Pager, WithoutHostMemoryTheBufferStaysWithTheCaller) {
  PagerHarnessOptions options;
  options.pinned_limit = 4 * kMiB;
  PagerHarness harness(options);
  HostThreadTimeline compute(harness.backend());
  EXPECT_FALSE(harness.pager().page_out(harness.filled(8 * kMiB, 1), compute).has_value());
  EXPECT_EQ(harness.pager().stats().num_host_full, 1);
  harness.pager().check_invariants();
}

}  // namespace
}  // namespace stowage
