// What HostBackend does beyond the conformance suite: capacity, RAM cost, CUDA's VMM rules in
// detail, fault injection, the kernel-mapping limit, bandwidth, synchronous mode.
#include "device/host/host_backend.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <thread>
#include <vector>

#include "base/errors.hpp"
#include "base/sanitizers.hpp"
#include "tests/conformance/pattern.hpp"
#include "tests/support/captured_log.hpp"
#include "tests/support/gate.hpp"

namespace stowage {
namespace {

using testing::CapturedLog;
using testing::Gate;
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

TEST(HostBackend, BytesWrittenThroughOneMappingAreReadThroughAStitchedOne) {
  // What the paged path does when it stitches: pages written where they were first mapped are
  // unmapped from there and mapped side by side into a new range, which reads the same bytes.
  HostBackend backend(small_device());
  const std::size_t g = backend.properties().granularity;
  auto* first = static_cast<unsigned char*>(backend.reserve_address_range(4 * g));
  std::vector<PhysicalHandle> handles;
  for (std::size_t i = 0; i < 4; ++i) {
    const auto handle = backend.try_create_physical(g);
    ASSERT_TRUE(handle);
    handles.push_back(*handle);
    backend.map(first + i * g, g, *handle);
  }
  backend.set_access(first, 4 * g);
  for (std::size_t i = 0; i < 4; ++i) std::memset(first + i * g, static_cast<int>(0x10 + i), g);
  // Pages 3 and 1, in that order, become one contiguous range elsewhere.
  backend.unmap(first + 3 * g, g);
  backend.unmap(first + 1 * g, g);
  auto* stitched = static_cast<unsigned char*>(backend.reserve_address_range(2 * g));
  backend.map(stitched, g, handles[3]);
  backend.map(stitched + g, g, handles[1]);
  backend.set_access(stitched, 2 * g);
  EXPECT_EQ(stitched[0], 0x13);
  EXPECT_EQ(stitched[g - 1], 0x13);
  EXPECT_EQ(stitched[g], 0x11);
  EXPECT_EQ(stitched[2 * g - 1], 0x11);
  // Writes through the stitched range land in the same physical memory.
  stitched[g + 5] = 0xEE;
  backend.unmap(stitched + g, g);
  backend.map(first + 1 * g, g, handles[1]);
  backend.set_access(first + 1 * g, g);
  EXPECT_EQ(first[g + 5], 0xEE);
  EXPECT_EQ(first[0], 0x10) << "pages that never moved are untouched";
  backend.unmap(stitched, g);
  backend.unmap(first, 2 * g);
  backend.unmap(first + 2 * g, g);
  for (const PhysicalHandle handle : handles) backend.release_physical(handle);
  backend.release_address_range(stitched, 2 * g);
  backend.release_address_range(first, 4 * g);
  EXPECT_EQ(backend.used_bytes(), 0u);
  backend.check_invariants();
}

TEST(HostBackend, UnbackedMappingsKeepTheRulesAndCostNoKernelMappings) {
  HostBackendOptions options = small_device();
  options.back_mappings = false;
  HostBackend backend(options);
  const std::size_t g = backend.properties().granularity;
  const std::size_t before = backend.kernel_mappings();
  void* base = backend.reserve_address_range(2 * g);
  const auto handle = backend.try_create_physical(g);
  ASSERT_TRUE(handle);
  EXPECT_THROW(backend.map(base, 2 * g, *handle), LogicError) << "a handle is mapped whole";
  backend.map(base, g, *handle);
  backend.set_access(base, g);
  EXPECT_EQ(backend.kernel_mappings(), before + 1) << "only the reservation";
  EXPECT_THROW(backend.memset_async(base, 0, 16, Stream{0}), LogicError)
      << "unbacked memory cannot be touched";
  backend.unmap(base, g);
  backend.release_physical(*handle);
  backend.release_address_range(base, 2 * g);
  backend.check_invariants();
}

TEST(HostBackend, PhysicalMemoryIsReturnedWhenFreed) {
  HostBackendOptions options = small_device();
  options.release_freed_memory = true;
  HostBackend backend(options);
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

#if !defined(STOWAGE_THREAD_SANITIZER)
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

TEST(HostBackend, AnInjectedCorruptionFlipsOneByteOfTheChosenCopyOnly) {
  HostBackend backend(small_device());
  void* device = backend.try_allocate_segment(4096);
  ASSERT_NE(device, nullptr);
  std::vector<unsigned char> source(4096, 0xAB), back(4096, 0);
  const Stream stream = backend.create_stream();
  backend.faults().corrupt_nth(BackendCall::kCopy, 2);
  backend.copy_async(device, source.data(), 4096, stream);  // the first: faithful
  backend.copy_async(back.data(), device, 4096, stream);    // the second: one byte flipped
  backend.synchronize_stream(stream);
  std::size_t differing = 0;
  for (std::size_t i = 0; i < back.size(); ++i) differing += back[i] != source[i] ? 1u : 0u;
  EXPECT_EQ(differing, 1u);
  backend.copy_async(back.data(), device, 4096, stream);  // disarmed once fired
  backend.synchronize_stream(stream);
  EXPECT_EQ(back, source);
  EXPECT_EQ(backend.faults().faults_fired(), 1u);
  backend.destroy_stream(stream);
  backend.free_segment(device);
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
  options.max_mappings = 6;
  HostBackend backend(options);  // 1 mapping: the segment region
  EXPECT_EQ(backend.kernel_mappings(), 1u);
  const std::size_t g = backend.properties().granularity;
  char* base = static_cast<char*>(backend.reserve_address_range(4 * g));  // 2
  const auto a = backend.try_create_physical(g);
  const auto b = backend.try_create_physical(g);
  const auto c = backend.try_create_physical(g);
  backend.map(base, g, *a);      // 4
  backend.map(base + g, g, *b);  // 6
  try {
    backend.map(base + 2 * g, g, *c);
    FAIL() << "a seventh kernel mapping was allowed";
  } catch (const BackendError& error) {
    EXPECT_NE(std::string(error.what()).find("max_map_count"), std::string::npos) << error.what();
  }
  EXPECT_EQ(backend.kernel_mappings(), 6u);
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

TEST(HostBackend, RegisteredHostMemorySharesThePinnedLimit) {
  HostBackendOptions options = small_device();
  options.pinned_capacity_bytes = 8 * kMiB;
  HostBackend backend(options);
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* host = std::aligned_alloc(page, 6 * kMiB);
  ASSERT_NE(host, nullptr);
  void* pinned = backend.try_allocate_pinned(4 * kMiB);
  ASSERT_NE(pinned, nullptr);
  EXPECT_FALSE(backend.try_register_host(host, 6 * kMiB)) << "4 + 6 MiB passes the 8 MiB limit";
  backend.free_pinned(pinned);
  EXPECT_TRUE(backend.try_register_host(host, 6 * kMiB));
  EXPECT_EQ(backend.pinned_bytes(), 6 * kMiB);
  EXPECT_THROW(backend.try_register_host(static_cast<char*>(host) + page, page), LogicError)
      << "overlaps the registered range";
  EXPECT_THROW(backend.unregister_host(static_cast<char*>(host) + page), LogicError)
      << "not the start of a registered range";
  backend.unregister_host(host);
  EXPECT_EQ(backend.pinned_bytes(), 0u);
  backend.check_invariants();
  std::free(host);
}

TEST(HostBackend, AForkedChildHasWorkingStreamsAndSoDoesTheParent) {
  HostBackend backend(small_device());
  void* segment = backend.try_allocate_segment(kMiB);
  ASSERT_NE(segment, nullptr);
  const Stream stream = backend.create_stream();
  const auto data = pattern(kMiB, 5);
  backend.copy_async(segment, data.data(), kMiB, stream);
  backend.prepare_fork();
  const pid_t child = ::fork();
  backend.after_fork();
  ASSERT_GE(child, 0);
  const auto round_trip = [&] {
    std::vector<std::uint8_t> out(kMiB);
    backend.copy_async(out.data(), segment, kMiB, stream);
    backend.synchronize_stream(stream);
    return out == data;
  };
  if (child == 0) ::_exit(round_trip() ? 0 : 1);  // the child's streams run on its own threads
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(round_trip());
  backend.destroy_stream(stream);
  backend.free_segment(segment);
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

TEST_F(HostVmmRules, ANonZeroOffsetIsRefusedEvenForAWholeHandle) {
  const auto handle = backend_.try_create_physical(2 * g_);
  EXPECT_THROW(backend_.map(base_, 2 * g_, *handle, g_), LogicError);
  EXPECT_EQ(backend_.kernel_mappings(), 2u) << "nothing was mapped";
}

TEST_F(HostVmmRules, AHandleMappedTwiceIsFreedAtItsLastUnmap) {
  const auto handle = backend_.try_create_physical(g_);
  backend_.map(base_, g_, *handle);
  backend_.map(base_ + 4 * g_, g_, *handle);
  backend_.release_physical(*handle);
  backend_.unmap(base_, g_);
  EXPECT_EQ(backend_.used_bytes(), g_) << "one view is left";
  backend_.unmap(base_ + 4 * g_, g_);
  EXPECT_EQ(backend_.used_bytes(), 0u);
  backend_.check_invariants();
}

TEST(HostBackend, BadOptionsAreRefusedWithTheirName) {
  auto refused = [](HostBackendOptions options, const char* part) {
    try {
      HostBackend backend(options);
      ADD_FAILURE() << "accepted: " << part;
    } catch (const LogicError& error) {
      EXPECT_NE(std::string(error.what()).find(part), std::string::npos) << error.what();
    }
  };
  HostBackendOptions options;
  options.granularity = 0;
  refused(options, "granularity");
  options.granularity = 3 * kMiB;
  refused(options, "granularity");
  options = {};
  options.capacity_bytes = 0;
  refused(options, "capacity");
  options.capacity_bytes = HostBackend::kMaxCapacity + 1;
  refused(options, "capacity");
  options = {};
  options.copy_bytes_per_second = -1;
  refused(options, "bandwidth");
  options.copy_bytes_per_second = 1e3;  // 1 KB/s: below the floor waits assume (Note [Bounded waits])
  refused(options, "bandwidth");
  options.copy_bytes_per_second = std::numeric_limits<double>::quiet_NaN();
  refused(options, "bandwidth");
}

TEST(HostBackend, HugeOrWildArgumentsAreRefusedNotOverflowed) {
  HostBackend backend(small_device());
  const std::size_t g = backend.properties().granularity;
  const std::size_t huge = ~std::size_t{0};
  EXPECT_EQ(backend.try_allocate_segment(huge), nullptr);
  EXPECT_FALSE(backend.try_create_physical(huge / g * g).has_value());
  EXPECT_THROW(backend.reserve_address_range(huge / g * g), LogicError);
  EXPECT_THROW(backend.reserve_address_range(g, std::size_t{1} << 62), LogicError);
  void* segment = backend.try_allocate_segment(4096);
  std::vector<char> host(8192);
  EXPECT_THROW(backend.copy_async(segment, host.data(), huge, Stream{0}), LogicError);
  EXPECT_THROW(backend.copy_async(nullptr, host.data(), 16, Stream{0}), LogicError);
  EXPECT_THROW(backend.copy_async(host.data(), nullptr, 16, Stream{0}), LogicError);
  // A host range that runs into the segment from below.
  auto* below = static_cast<char*>(segment) - 64;
  EXPECT_THROW(backend.copy_async(below, host.data(), 128, Stream{0}), LogicError);
  backend.synchronize_device();
  backend.free_segment(segment);
  backend.check_invariants();
}

TEST(HostBackend, EveryInjectedFaultFailsOneCallAndChangesNothing) {
  HostBackend backend(small_device(256 * kMiB));  // room for what the retried calls leave
  const std::size_t g = backend.properties().granularity;
  std::vector<char> host(64);
  // Host pages to pin: one pinned before each call, one for register_host itself.
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<char> pages(3 * page);
  void* registered = reinterpret_cast<void*>(round_up(reinterpret_cast<std::uintptr_t>(pages.data()), page));
  void* host_page = static_cast<char*>(registered) + page;
  for (std::size_t kind = 0; kind < kBackendCallKinds; ++kind) {
    const auto call = static_cast<BackendCall>(kind);
    SCOPED_TRACE(std::string(backend_call_name(call)));
    // State every call can act on.
    void* segment = backend.try_allocate_segment(4096);
    void* pinned = backend.try_allocate_pinned(4096);
    void* range = backend.reserve_address_range(2 * g);
    void* spare = backend.reserve_address_range(g);  // empty: releasable
    const auto handle = backend.try_create_physical(g);
    ASSERT_TRUE(segment && pinned && range && spare && handle);
    backend.map(range, g, *handle);
    const Stream stream = backend.create_stream();
    const Event event = backend.create_event();
    ASSERT_TRUE(backend.try_register_host(registered, page));
    const std::size_t used = backend.used_bytes();
    const std::size_t mappings = backend.kernel_mappings();

    backend.faults().fail_nth(call, 1);
    auto attempt = [&]() -> bool {  // true: the call reported its failure
      switch (call) {
        case BackendCall::kAllocateSegment: return backend.try_allocate_segment(4096) == nullptr;
        case BackendCall::kFreeSegment: backend.free_segment(segment); return false;
        case BackendCall::kReserve: backend.reserve_address_range(g); return false;
        case BackendCall::kReleaseReservation: backend.release_address_range(spare, g); return false;
        case BackendCall::kCreatePhysical: return !backend.try_create_physical(g).has_value();
        case BackendCall::kReleasePhysical: backend.release_physical(*handle); return false;
        case BackendCall::kMap: backend.map(static_cast<char*>(range) + g, g, *handle); return false;
        case BackendCall::kSetAccess: backend.set_access(range, g); return false;
        case BackendCall::kUnmap: backend.unmap(range, g); return false;
        case BackendCall::kCreateStream: backend.create_stream(); return false;
        case BackendCall::kCreateEvent: backend.create_event(); return false;
        case BackendCall::kRecordEvent: backend.record_event(event, stream); return false;
        case BackendCall::kCopy: backend.copy_async(segment, host.data(), 64, stream); return false;
        case BackendCall::kMemset: backend.memset_async(segment, 0, 64, stream); return false;
        case BackendCall::kAllocatePinned: return backend.try_allocate_pinned(4096) == nullptr;
        case BackendCall::kFreePinned: backend.free_pinned(pinned); return false;
        case BackendCall::kRegisterHost: return !backend.try_register_host(host_page, page);
        case BackendCall::kUnregisterHost: backend.unregister_host(registered); return false;
        case BackendCall::kSynchronize: backend.synchronize_stream(stream); return false;
        case BackendCall::kCount: break;
      }
      return false;
    };
    bool failed = false;
    try {
      failed = attempt();
    } catch (const BackendError& error) {
      failed = std::string(error.what()).find("injected fault") != std::string::npos;
    }
    EXPECT_TRUE(failed);
    EXPECT_EQ(backend.used_bytes(), used);
    EXPECT_EQ(backend.kernel_mappings(), mappings);
    backend.check_invariants();
    // The same call succeeds now, on the state left unchanged.
    EXPECT_NO_THROW(attempt());

    backend.synchronize_device();
    backend.destroy_event(event);
    backend.destroy_stream(stream);
    if (call != BackendCall::kFreeSegment) backend.free_segment(segment);
    if (call != BackendCall::kFreePinned) backend.free_pinned(pinned);
    if (call == BackendCall::kMap) backend.unmap(range, 2 * g);
    if (call != BackendCall::kMap && call != BackendCall::kUnmap) backend.unmap(range, g);
    if (call != BackendCall::kReleasePhysical) backend.release_physical(*handle);
    backend.release_address_range(range, 2 * g);
    if (call != BackendCall::kReleaseReservation) backend.release_address_range(spare, g);
    if (call == BackendCall::kRegisterHost) backend.unregister_host(host_page);
    if (call != BackendCall::kUnregisterHost) backend.unregister_host(registered);
  }
  EXPECT_EQ(backend.faults().faults_fired(), kBackendCallKinds);
}

TEST(HostBackend, FreeingASegmentWaitsForWorkStillQueuedOnIt) {
  HostBackendOptions options = small_device();
  HostBackend backend(options);
  const Stream stream = backend.create_stream();
  void* segment = backend.try_allocate_segment(kMiB);
  std::vector<char> host(kMiB, 5);
  std::atomic<bool> copied{false};
  backend.enqueue_host_function(stream, [] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); });
  backend.copy_async(segment, host.data(), kMiB, stream);
  backend.enqueue_host_function(stream, [&] { copied = true; });
  backend.free_segment(segment);
  EXPECT_TRUE(copied.load()) << "cudaFree semantics: the device finishes first";
  backend.destroy_stream(stream);
}

TEST(HostBackend, AHostFunctionThatThrowsIsReportedAndTheStreamGoesOn) {
  for (const bool synchronous : {false, true}) {
    HostBackendOptions options = small_device();
    options.synchronous = synchronous;
    HostBackend backend(options);
    CapturedLog log;
    bool ran_after = false;
    backend.enqueue_host_function(Stream{0}, [] { throw std::runtime_error("boom"); });
    backend.enqueue_host_function(Stream{0}, [&] { ran_after = true; });
    backend.synchronize_stream(Stream{0});
    EXPECT_TRUE(ran_after);
    ASSERT_EQ(log.lines().size(), 1u);
    EXPECT_NE(log.lines()[0].find("boom"), std::string::npos);
  }
}

TEST(HostBackend, SynchronousModeSynchronizeWaitsForAnotherThreadsInlineWork) {
  HostBackendOptions options = small_device();
  options.synchronous = true;
  HostBackend backend(options);
  std::atomic<bool> started{false};
  std::atomic<bool> finished{false};
  std::thread worker([&] {
    backend.enqueue_host_function(Stream{0}, [&] {
      started = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      finished = true;
    });
  });
  while (!started.load()) std::this_thread::yield();
  backend.synchronize_stream(Stream{0});
  EXPECT_TRUE(finished.load());
  worker.join();
}

}  // namespace
}  // namespace stowage

namespace stowage {
namespace {

TEST(HostBackendCosts, EachCallIsChargedTheCostOfItsKindAndNothingIsSpent) {
  HostBackendOptions options;
  options.capacity_bytes = 64 * kMiB;
  options.synchronous = true;
  options.call_costs.set(BackendCall::kMap, 1000).set(BackendCall::kSynchronize, 7);
  HostBackend backend(options);
  const std::size_t g = backend.properties().granularity;
  void* range = backend.reserve_address_range(2 * g);
  const auto first = backend.try_create_physical(g);
  const auto second = backend.try_create_physical(g);
  ASSERT_TRUE(first && second);
  backend.map(range, g, *first);
  backend.map(static_cast<char*>(range) + g, g, *second);
  backend.synchronize_device();
  EXPECT_EQ(backend.charged_ns(), 2 * 1000u + 7u) << "two maps and one synchronisation";
  EXPECT_EQ(backend.faults().calls(BackendCall::kSynchronize), 1u);
  backend.unmap(range, 2 * g);
  backend.release_physical(*first);
  backend.release_physical(*second);
  backend.release_address_range(range, 2 * g);
  EXPECT_EQ(backend.charged_ns(), 2007u) << "calls without a cost are free";
  EXPECT_FALSE(HostCallCosts{}.any());
  EXPECT_TRUE(HostCallCosts::measured_h100().any());
  EXPECT_GT(HostCallCosts::measured_h100().of(BackendCall::kMap), 0u);
}

}  // namespace
}  // namespace stowage
