// What HostBackend does beyond the conformance suite: capacity, RAM cost, CUDA's VMM rules in
// detail, fault injection, the kernel-mapping limit, bandwidth, synchronous mode.
#include "allocator/host_backend.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "allocator/errors.hpp"
#include "tests/conformance/pattern.hpp"

namespace stowage {
namespace {

using testing::pattern;

HostBackendOptions small_device(std::size_t capacity = 64 * kMiB) {
  HostBackendOptions options;
  options.capacity_bytes = capacity;
  return options;
}

// Resident memory of this process, anonymous and shared together.
std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0;
  std::size_t resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

TEST(HostBackend, CapacityCountsSegmentsAndPhysicalHandlesTogether) {
  HostBackend backend(small_device(64 * kMiB));
  void* segment = backend.try_allocate_segment(40 * kMiB);
  ASSERT_NE(segment, nullptr);
  const auto handle = backend.try_create_physical(24 * kMiB);
  ASSERT_TRUE(handle);
  EXPECT_EQ(backend.used_bytes(), 64 * kMiB);
  EXPECT_EQ(backend.memory_info().free_bytes, 0u);
  EXPECT_FALSE(backend.try_create_physical(2 * kMiB).has_value());
  EXPECT_EQ(backend.try_allocate_segment(1), nullptr);

  backend.free_segment(segment);
  EXPECT_EQ(backend.memory_info().free_bytes, 40 * kMiB);
  const auto second = backend.try_create_physical(40 * kMiB);
  EXPECT_TRUE(second);
  backend.release_physical(*handle);
  backend.release_physical(*second);
  EXPECT_EQ(backend.used_bytes(), 0u);
  backend.check_invariants();
}

TEST(HostBackend, HugeDeviceCostsNoMemoryUntilTouched) {
  HostBackendOptions options;
  options.capacity_bytes = 80 * kGiB;
  HostBackend backend(options);
  const std::size_t before = resident_bytes();
  auto* segment = static_cast<char*>(backend.try_allocate_segment(64 * kGiB));
  ASSERT_NE(segment, nullptr);
  EXPECT_LT(resident_bytes(), before + 32 * kMiB) << "an untouched segment must cost no RAM";
  std::memset(segment + 10 * kGiB, 1, 16 * kMiB);
  EXPECT_GE(resident_bytes(), before + 16 * kMiB);
  backend.free_segment(segment);
}

TEST(HostBackend, PhysicalMemoryIsReturnedWhenFreed) {
  HostBackend backend(small_device());
  const std::size_t g = backend.properties().granularity;
  void* base = backend.reserve_address_range(8 * g);
  const auto first = backend.try_create_physical(8 * g);
  ASSERT_TRUE(first);
  backend.map(base, 8 * g, *first);
  backend.set_access(base, 8 * g);
  std::memset(base, 0xAB, 8 * g);
  backend.unmap(base, 8 * g);
  backend.release_physical(*first);
  EXPECT_EQ(backend.used_bytes(), 0u);

  // The next handle reuses the same stretch of the device file; it must not see old bytes,
  // which shows the hole was punched (and the RAM given back).
  const auto second = backend.try_create_physical(8 * g);
  ASSERT_TRUE(second);
  backend.map(base, 8 * g, *second);
  backend.set_access(base, 8 * g);
  const std::vector<char> zeros(8 * g, 0);
  EXPECT_EQ(std::memcmp(base, zeros.data(), 8 * g), 0);
  backend.unmap(base, 8 * g);
  backend.release_physical(*second);
  backend.release_address_range(base, 8 * g);
  backend.check_invariants();
}

#if !defined(__SANITIZE_THREAD__)
TEST(HostBackendDeathTest, MemoryIsInaccessibleUntilAccessIsSet) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  HostBackend backend(small_device());
  const std::size_t g = backend.properties().granularity;
  auto* base = static_cast<volatile char*>(backend.reserve_address_range(g));
  const auto handle = backend.try_create_physical(g);
  ASSERT_TRUE(handle);
  backend.map(const_cast<char*>(base), g, *handle);
  EXPECT_DEATH(base[0] = 1, "");
  backend.set_access(const_cast<char*>(base), g);
  base[0] = 1;
  EXPECT_EQ(base[0], 1);
}
#endif

TEST(HostBackend, CopiesIntoMappedButInaccessibleMemoryAreRefused) {
  HostBackend backend(small_device());
  const std::size_t g = backend.properties().granularity;
  void* base = backend.reserve_address_range(2 * g);
  const auto handle = backend.try_create_physical(g);
  ASSERT_TRUE(handle);
  std::vector<char> host(g, 1);
  EXPECT_THROW(backend.copy_async(base, host.data(), g, Stream{0}), LogicError) << "unmapped";
  backend.map(base, g, *handle);
  EXPECT_THROW(backend.copy_async(base, host.data(), g, Stream{0}), LogicError) << "no access";
  backend.set_access(base, g);
  backend.copy_async(base, host.data(), g, Stream{0});
  EXPECT_THROW(backend.copy_async(base, host.data(), g + 1, Stream{0}), LogicError)
      << "runs into unmapped space";
  backend.synchronize_device();
}

TEST(HostBackend, CopiesPastTheEndOfASegmentAreRefused) {
  HostBackend backend(small_device());
  void* segment = backend.try_allocate_segment(4096);
  std::vector<char> host(8192, 0);
  EXPECT_THROW(backend.copy_async(segment, host.data(), 4097, Stream{0}), LogicError);
  EXPECT_THROW(backend.memset_async(segment, 0, 4097, Stream{0}), LogicError);
  backend.copy_async(segment, host.data(), 4096, Stream{0});
  backend.synchronize_device();
  backend.free_segment(segment);
}

class HostVmmRules : public ::testing::Test {
 protected:
  HostBackend backend_{small_device()};
  const std::size_t g_ = backend_.properties().granularity;
  char* base_ = static_cast<char*>(backend_.reserve_address_range(8 * g_));
};

TEST_F(HostVmmRules, AHandleIsMappedWhole) {
  const auto handle = backend_.try_create_physical(2 * g_);
  EXPECT_THROW(backend_.map(base_, g_, *handle), LogicError);
  EXPECT_THROW(backend_.map(base_, 4 * g_, *handle), LogicError);
  backend_.map(base_, 2 * g_, *handle);
  backend_.check_invariants();
}

TEST_F(HostVmmRules, SizesAndAddressesAreMultiplesOfTheGranularity) {
  EXPECT_THROW(backend_.reserve_address_range(g_ + 4096), LogicError);
  EXPECT_THROW(backend_.try_create_physical(g_ / 2), LogicError);
  const auto handle = backend_.try_create_physical(g_);
  EXPECT_THROW(backend_.map(base_ + 4096, g_, *handle), LogicError);
}

TEST_F(HostVmmRules, MapsGoIntoReservedUnmappedSpaceOnly) {
  const auto a = backend_.try_create_physical(2 * g_);
  const auto b = backend_.try_create_physical(2 * g_);
  backend_.map(base_ + 2 * g_, 2 * g_, *a);
  EXPECT_THROW(backend_.map(base_ + 3 * g_, 2 * g_, *b), LogicError) << "overlaps a";
  EXPECT_THROW(backend_.map(base_ + g_, 2 * g_, *b), LogicError) << "overlaps a";
  EXPECT_THROW(backend_.map(base_ + 7 * g_, 2 * g_, *b), LogicError) << "leaves the reservation";
  std::vector<char> outside(4 * g_);
  EXPECT_THROW(backend_.map(outside.data(), 2 * g_, *b), LogicError) << "not reserved";
  backend_.map(base_ + 4 * g_, 2 * g_, *b);
  backend_.check_invariants();
}

TEST_F(HostVmmRules, SetAccessAndUnmapCoverWholeAdjacentMappings) {
  const auto a = backend_.try_create_physical(2 * g_);
  const auto b = backend_.try_create_physical(g_);
  backend_.map(base_, 2 * g_, *a);
  backend_.map(base_ + 3 * g_, g_, *b);  // a gap of one granule between a and b
  EXPECT_THROW(backend_.set_access(base_, g_), LogicError) << "part of a mapping";
  EXPECT_THROW(backend_.set_access(base_, 4 * g_), LogicError) << "spans a gap";
  EXPECT_THROW(backend_.unmap(base_, 4 * g_), LogicError) << "spans a gap";
  EXPECT_THROW(backend_.unmap(base_ + 2 * g_, g_), LogicError) << "nothing mapped";
  backend_.set_access(base_, 2 * g_);
  backend_.unmap(base_ + 3 * g_, g_);
  backend_.unmap(base_, 2 * g_);
  backend_.check_invariants();
}

TEST_F(HostVmmRules, ReservationsAreReleasedWholeAndEmpty) {
  const auto a = backend_.try_create_physical(g_);
  backend_.map(base_, g_, *a);
  EXPECT_THROW(backend_.release_address_range(base_, 8 * g_), LogicError) << "still mapped";
  backend_.unmap(base_, g_);
  EXPECT_THROW(backend_.release_address_range(base_, 4 * g_), LogicError) << "part of it";
  EXPECT_THROW(backend_.release_address_range(base_ + g_, 7 * g_), LogicError) << "not its start";
  backend_.release_address_range(base_, 8 * g_);
  EXPECT_THROW(backend_.release_address_range(base_, 8 * g_), LogicError) << "twice";
  backend_.release_physical(*a);
}

TEST_F(HostVmmRules, ReleasedHandlesCannotBeMappedOrReleasedAgain) {
  const auto a = backend_.try_create_physical(g_);
  backend_.map(base_, g_, *a);
  backend_.release_physical(*a);
  EXPECT_EQ(backend_.used_bytes(), g_) << "still mapped: the memory stays";
  EXPECT_THROW(backend_.release_physical(*a), LogicError);
  EXPECT_THROW(backend_.map(base_ + g_, g_, *a), LogicError);
  backend_.unmap(base_, g_);
  EXPECT_EQ(backend_.used_bytes(), 0u);
  EXPECT_THROW(backend_.release_physical(PhysicalHandle{12345}), LogicError);
}

TEST(HostBackend, UnknownPointersAreRefused) {
  HostBackend backend(small_device());
  int local = 0;
  EXPECT_THROW(backend.free_segment(&local), LogicError);
  EXPECT_THROW(backend.free_pinned(&local), LogicError);
  void* segment = backend.try_allocate_segment(4096);
  backend.free_segment(segment);
  EXPECT_THROW(backend.free_segment(segment), LogicError) << "double free";
  EXPECT_THROW(backend.destroy_stream(Stream{999}), LogicError);
  EXPECT_THROW(backend.record_event(Event{999}, Stream{0}), LogicError);
}

TEST(HostBackend, InjectedFaultsFailTheChosenCallOnly) {
  HostBackend backend(small_device());
  const std::size_t g = backend.properties().granularity;
  backend.faults().fail_nth(BackendCall::kAllocateSegment, 2);
  void* first = backend.try_allocate_segment(4096);
  EXPECT_NE(first, nullptr);
  EXPECT_EQ(backend.try_allocate_segment(4096), nullptr) << "the second call fails";
  void* third = backend.try_allocate_segment(4096);
  EXPECT_NE(third, nullptr);
  EXPECT_EQ(backend.faults().calls(BackendCall::kAllocateSegment), 3u);

  backend.faults().fail_nth(BackendCall::kCreatePhysical, 1);
  EXPECT_FALSE(backend.try_create_physical(g).has_value());

  void* base = backend.reserve_address_range(g);
  const auto handle = backend.try_create_physical(g);
  ASSERT_TRUE(handle);
  backend.faults().fail_nth(BackendCall::kMap, 1);
  EXPECT_THROW(backend.map(base, g, *handle), BackendError);
  backend.check_invariants();
  backend.map(base, g, *handle);  // the failed call changed nothing: the map now succeeds
  backend.faults().fail_nth(BackendCall::kSetAccess, 1);
  EXPECT_THROW(backend.set_access(base, g), BackendError);
  backend.set_access(base, g);
  backend.faults().fail_nth(BackendCall::kUnmap, 1);
  EXPECT_THROW(backend.unmap(base, g), BackendError);
  backend.unmap(base, g);

  backend.faults().fail_nth(BackendCall::kAllocatePinned, 1);
  EXPECT_EQ(backend.try_allocate_pinned(4096), nullptr);
  backend.faults().fail_nth(BackendCall::kCopy, 1);
  std::vector<char> host(16);
  EXPECT_THROW(backend.copy_async(first, host.data(), 16, Stream{0}), BackendError);
  EXPECT_EQ(backend.faults().faults_fired(), 7u);

  backend.release_physical(*handle);
  backend.release_address_range(base, g);
  backend.free_segment(first);
  backend.free_segment(third);
  backend.check_invariants();
}

TEST(HostBackend, RefusesToPassItsKernelMappingLimit) {
  HostBackendOptions options = small_device();
  options.max_mappings = 5;
  HostBackend backend(options);
  const std::size_t g = backend.properties().granularity;
  char* base = static_cast<char*>(backend.reserve_address_range(4 * g));  // 1 mapping
  const auto a = backend.try_create_physical(g);
  const auto b = backend.try_create_physical(g);
  const auto c = backend.try_create_physical(g);
  backend.map(base, g, *a);      // 3
  backend.map(base + g, g, *b);  // 5
  try {
    backend.map(base + 2 * g, g, *c);
    FAIL() << "a sixth kernel mapping was allowed";
  } catch (const BackendError& error) {
    EXPECT_NE(std::string(error.what()).find("max_map_count"), std::string::npos) << error.what();
  }
  EXPECT_EQ(backend.kernel_mappings(), 5u);
  backend.unmap(base + g, g);
  backend.map(base + 2 * g, g, *c);
  backend.check_invariants();
}

TEST(HostBackend, CopiesHonourTheBandwidthLimit) {
  HostBackendOptions options = small_device();
  options.copy_bytes_per_second = 100e6;  // 8 MiB takes about 84 ms
  HostBackend backend(options);
  void* segment = backend.try_allocate_segment(8 * kMiB);
  std::vector<char> host(8 * kMiB, 3);
  const auto start = std::chrono::steady_clock::now();
  backend.copy_async(segment, host.data(), host.size(), Stream{0});
  backend.synchronize_stream(Stream{0});
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed.count(), 0.95 * static_cast<double>(host.size()) / 100e6);
  backend.free_segment(segment);
}

TEST(HostBackend, SynchronousModeRunsStreamWorkBeforeReturning) {
  HostBackendOptions options = small_device();
  options.synchronous = true;
  HostBackend backend(options);
  const Stream stream = backend.create_stream();
  bool ran = false;
  backend.enqueue_host_function(stream, [&] { ran = true; });
  EXPECT_TRUE(ran);
  const Event event = backend.create_event();
  backend.record_event(event, stream);
  EXPECT_TRUE(backend.query_event(event));
  backend.destroy_event(event);
  backend.destroy_stream(stream);
}

TEST(HostBackend, PinnedMemoryHasItsOwnLimit) {
  HostBackendOptions options = small_device();
  options.pinned_capacity_bytes = 8 * kMiB;
  HostBackend backend(options);
  void* a = backend.try_allocate_pinned(6 * kMiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(backend.try_allocate_pinned(4 * kMiB), nullptr);
  EXPECT_EQ(backend.pinned_bytes(), 6 * kMiB);
  EXPECT_EQ(backend.used_bytes(), 0u) << "pinned memory is host memory, not device memory";
  backend.free_pinned(a);
  void* b = backend.try_allocate_pinned(8 * kMiB);
  EXPECT_NE(b, nullptr);
  backend.free_pinned(b);
}

TEST(HostBackend, ConcurrentCallersKeepTheAccountsStraight) {
  HostBackend backend(small_device(256 * kMiB));
  const std::size_t g = backend.properties().granularity;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const Stream stream = backend.create_stream();
      for (int i = 0; i < 50; ++i) {
        const std::size_t bytes = 4096 * static_cast<std::size_t>(1 + (i + t) % 7);
        void* segment = backend.try_allocate_segment(bytes);
        void* base = backend.reserve_address_range(g);
        const auto handle = backend.try_create_physical(g);
        if (segment == nullptr || !handle) {
          ++failures;
          continue;
        }
        backend.map(base, g, *handle);
        backend.set_access(base, g);
        const auto data = pattern(bytes, static_cast<std::uint32_t>(t * 100 + i));
        std::vector<std::uint8_t> back(bytes);
        backend.copy_async(segment, data.data(), bytes, stream);
        backend.copy_async(base, segment, bytes, stream);
        backend.copy_async(back.data(), base, bytes, stream);
        backend.synchronize_stream(stream);
        if (back != data) ++failures;
        backend.unmap(base, g);
        backend.release_physical(*handle);
        backend.release_address_range(base, g);
        backend.free_segment(segment);
      }
      backend.destroy_stream(stream);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(backend.used_bytes(), 0u);
  backend.check_invariants();
}

}  // namespace
}  // namespace stowage
