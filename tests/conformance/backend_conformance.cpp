#include "tests/conformance/backend_conformance.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>

#include <unistd.h>

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "tests/support/gate.hpp"

namespace stowage::testing {

std::string backend_test_name(const ::testing::TestParamInfo<BackendUnderTest>& info) {
  return info.param.name;
}

void BackendConformance::SetUp() {
  backend_ = GetParam().make();
  if (!backend_) GTEST_SKIP() << GetParam().name << ": no such device on this machine";
}

void BackendConformance::TearDown() {
  if (backend_) backend_->synchronize_device();
}

void BackendConformance::write(void* device, const std::vector<std::uint8_t>& bytes,
                               Stream stream) {
  backend_->copy_async(device, bytes.data(), bytes.size(), stream);
  backend_->synchronize_stream(stream);
}

std::vector<std::uint8_t> BackendConformance::read(const void* device, std::size_t bytes,
                                                   Stream stream) {
  std::vector<std::uint8_t> out(bytes);
  backend_->copy_async(out.data(), device, bytes, stream);
  backend_->synchronize_stream(stream);
  return out;
}

bool BackendConformance::skip_without_virtual_memory() {
  return !backend_->properties().virtual_memory;
}

namespace {

#define SKIP_IF_SYNCHRONOUS()                                                         \
  if (GetParam().synchronous) GTEST_SKIP() << "stream work runs inline on this backend"
#define SKIP_WITHOUT_VMM()                                                             \
  if (skip_without_virtual_memory()) GTEST_SKIP() << "backend has no virtual memory"

}  // namespace

// --- properties ---

TEST_P(BackendConformance, PropertiesDescribeTheDevice) {
  const DeviceProperties& properties = backend_->properties();
  EXPECT_FALSE(properties.name.empty());
  EXPECT_GT(properties.total_bytes, 0u);
  const MemoryInfo info = backend_->memory_info();
  EXPECT_EQ(info.total_bytes, properties.total_bytes);
  EXPECT_LE(info.free_bytes, info.total_bytes);
  if (properties.virtual_memory) {
    EXPECT_GT(properties.granularity, 0u);
    EXPECT_EQ(properties.granularity & (properties.granularity - 1), 0u)
        << "granularity must be a power of two";
  }
}

// --- segments ---

TEST_P(BackendConformance, SegmentHoldsWhatWasWrittenAndCountsAgainstFreeMemory) {
  const std::size_t bytes = 3 * kMiB + 512;
  const std::size_t free_before = backend_->memory_info().free_bytes;
  void* segment = backend_->try_allocate_segment(bytes);
  ASSERT_NE(segment, nullptr);
  const std::size_t free_during = backend_->memory_info().free_bytes;
  EXPECT_LE(free_during + bytes, free_before);

  const auto data = pattern(bytes, 7);
  write(segment, data);
  EXPECT_EQ(read(segment, bytes), data);

  backend_->free_segment(segment);
  EXPECT_GE(backend_->memory_info().free_bytes, free_during + bytes);
}

TEST_P(BackendConformance, SegmentLargerThanTheDeviceFailsSoftly) {
  const std::size_t total = backend_->properties().total_bytes;
  EXPECT_EQ(backend_->try_allocate_segment(total + 64 * kMiB), nullptr);
  // The backend stays usable after running out.
  void* segment = backend_->try_allocate_segment(kMiB);
  ASSERT_NE(segment, nullptr);
  backend_->free_segment(segment);
}

TEST_P(BackendConformance, LiveSegmentsNeverOverlap) {
  std::vector<std::pair<void*, std::size_t>> segments;
  for (std::uint32_t i = 0; i < 16; ++i) {
    const std::size_t bytes = (i % 4 + 1) * 256 * 1024 + i * 512;
    void* segment = backend_->try_allocate_segment(bytes);
    ASSERT_NE(segment, nullptr);
    write(segment, pattern(bytes, i));
    segments.emplace_back(segment, bytes);
  }
  // Every segment still holds its own pattern: none was overwritten by a neighbour.
  for (std::uint32_t i = 0; i < segments.size(); ++i) {
    EXPECT_EQ(read(segments[i].first, segments[i].second), pattern(segments[i].second, i))
        << "segment " << i;
  }
  for (const auto& [segment, bytes] : segments) backend_->free_segment(segment);
}

// --- virtual memory ---

TEST_P(BackendConformance, HandlesMappedSideBySideFormOneContiguousRange) {
  SKIP_WITHOUT_VMM();
  const std::size_t g = backend_->properties().granularity;
  char* base = static_cast<char*>(backend_->reserve_address_range(4 * g));
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(base) % g, 0u);
  const auto first = backend_->try_create_physical(g);
  const auto second = backend_->try_create_physical(2 * g);
  ASSERT_TRUE(first && second);
  // Mapped out of order: the second handle first, at the higher address.
  backend_->map(base + g, 2 * g, *second);
  backend_->map(base, g, *first);
  backend_->set_access(base, 3 * g);  // one call over two adjacent mappings

  const auto data = pattern(3 * g, 11);
  write(base, data);
  EXPECT_EQ(read(base, 3 * g), data);
  EXPECT_EQ(read(base + g, 2 * g), std::vector<std::uint8_t>(data.begin() + static_cast<long>(g),
                                                             data.end()));

  backend_->unmap(base, 3 * g);  // one call over two whole mappings
  backend_->release_physical(*first);
  backend_->release_physical(*second);
  backend_->release_address_range(base, 4 * g);
}

TEST_P(BackendConformance, TwoViewsOfOneHandleSeeTheSameBytes) {
  SKIP_WITHOUT_VMM();
  const std::size_t g = backend_->properties().granularity;
  void* view_a = backend_->reserve_address_range(2 * g);
  void* view_b = backend_->reserve_address_range(2 * g);
  const auto handle = backend_->try_create_physical(2 * g);
  ASSERT_TRUE(handle);
  backend_->map(view_a, 2 * g, *handle);
  backend_->map(view_b, 2 * g, *handle);
  backend_->set_access(view_a, 2 * g);
  backend_->set_access(view_b, 2 * g);

  const auto data = pattern(2 * g, 12);
  write(view_a, data);
  EXPECT_EQ(read(view_b, 2 * g), data);
  const auto update = pattern(g, 13);
  write(static_cast<char*>(view_b) + g, update);
  EXPECT_EQ(read(static_cast<char*>(view_a) + g, g), update);

  backend_->unmap(view_a, 2 * g);
  backend_->unmap(view_b, 2 * g);
  backend_->release_physical(*handle);
  backend_->release_address_range(view_a, 2 * g);
  backend_->release_address_range(view_b, 2 * g);
}

TEST_P(BackendConformance, ReleasedHandleStaysUsableUntilUnmapped) {
  SKIP_WITHOUT_VMM();
  const std::size_t g = backend_->properties().granularity;
  void* base = backend_->reserve_address_range(g);
  const auto handle = backend_->try_create_physical(g);
  ASSERT_TRUE(handle);
  backend_->map(base, g, *handle);
  backend_->set_access(base, g);
  backend_->release_physical(*handle);

  const auto data = pattern(g, 14);
  write(base, data);
  EXPECT_EQ(read(base, g), data);

  const std::size_t free_mapped = backend_->memory_info().free_bytes;
  backend_->unmap(base, g);
  EXPECT_GE(backend_->memory_info().free_bytes, free_mapped + g)
      << "the last unmap of a released handle returns its memory";
  backend_->release_address_range(base, g);
}

TEST_P(BackendConformance, PartOfAMappingCannotBeUnmapped) {
  SKIP_WITHOUT_VMM();
  const std::size_t g = backend_->properties().granularity;
  char* base = static_cast<char*>(backend_->reserve_address_range(2 * g));
  const auto handle = backend_->try_create_physical(2 * g);
  ASSERT_TRUE(handle);
  backend_->map(base, 2 * g, *handle);
  backend_->set_access(base, 2 * g);
  EXPECT_THROW(backend_->unmap(base, g), Error);
  EXPECT_THROW(backend_->unmap(base + g, g), Error);
  // The refused calls changed nothing: the whole mapping is still there and usable.
  const auto data = pattern(2 * g, 15);
  write(base, data);
  EXPECT_EQ(read(base, 2 * g), data);
  backend_->unmap(base, 2 * g);
  backend_->release_physical(*handle);
  backend_->release_address_range(base, 2 * g);
}

TEST_P(BackendConformance, HandlesAreMappedFromOffsetZero) {
  SKIP_WITHOUT_VMM();
  const std::size_t g = backend_->properties().granularity;
  void* base = backend_->reserve_address_range(2 * g);
  const auto handle = backend_->try_create_physical(2 * g);
  ASSERT_TRUE(handle);
  EXPECT_THROW(backend_->map(base, g, *handle, g), Error);  // the second half of the handle
  backend_->map(base, 2 * g, *handle, 0);
  backend_->unmap(base, 2 * g);
  backend_->release_physical(*handle);
  backend_->release_address_range(base, 2 * g);
}

TEST_P(BackendConformance, PhysicalMemoryBeyondTheDeviceFailsSoftly) {
  SKIP_WITHOUT_VMM();
  const std::size_t g = backend_->properties().granularity;
  const std::size_t too_much = (backend_->properties().total_bytes / g + 1) * g;
  EXPECT_FALSE(backend_->try_create_physical(too_much).has_value());
  const auto handle = backend_->try_create_physical(g);
  ASSERT_TRUE(handle);
  backend_->release_physical(*handle);
}

// --- streams, events, copies ---

TEST_P(BackendConformance, NeverRecordedEventIsComplete) {
  const Event event = backend_->create_event();
  EXPECT_TRUE(backend_->query_event(event));
  backend_->synchronize_event(event);  // returns at once
  backend_->destroy_event(event);
}

TEST_P(BackendConformance, EventCompletesWhenItsStreamReachesIt) {
  SKIP_IF_SYNCHRONOUS();
  const Stream stream = backend_->create_stream();
  const Event event = backend_->create_event();
  Gate gate;
  backend_->enqueue_host_function(stream, gate.blocker());
  backend_->record_event(event, stream);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(backend_->query_event(event)) << "the stream is blocked before the event";
  gate.open();
  backend_->synchronize_event(event);
  EXPECT_TRUE(backend_->query_event(event));
  backend_->destroy_event(event);
  backend_->destroy_stream(stream);
}

TEST_P(BackendConformance, StreamRunsItsWorkInOrder) {
  const Stream stream = backend_->create_stream();
  void* segment = backend_->try_allocate_segment(kMiB);
  // Pinned staging: a copy from pageable memory may read it when enqueued, not when it runs.
  auto* staging = static_cast<std::uint8_t*>(backend_->try_allocate_pinned(kMiB));
  auto* result = static_cast<std::uint8_t*>(backend_->try_allocate_pinned(kMiB));
  ASSERT_TRUE(segment && staging && result);
  std::memset(staging, 0, kMiB);
  std::memset(result, 0, kMiB);
  const auto expected = pattern(kMiB, 21);
  std::vector<int> order;
  // The host function fills the staging buffer; the copies that follow must see its bytes.
  backend_->enqueue_host_function(stream, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::memcpy(staging, expected.data(), kMiB);
    order.push_back(1);
  });
  backend_->copy_async(segment, staging, kMiB, stream);
  backend_->copy_async(result, segment, kMiB, stream);
  backend_->enqueue_host_function(stream, [&] { order.push_back(2); });
  backend_->synchronize_stream(stream);
  EXPECT_EQ(std::memcmp(result, expected.data(), kMiB), 0);
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  backend_->destroy_stream(stream);
  backend_->free_pinned(staging);
  backend_->free_pinned(result);
  backend_->free_segment(segment);
}

TEST_P(BackendConformance, AWaitIsForTheRecordingItSawNotALaterOne) {
  SKIP_IF_SYNCHRONOUS();
  const Stream slow = backend_->create_stream();
  const Stream idle = backend_->create_stream();
  const Stream waiter = backend_->create_stream();
  const Event event = backend_->create_event();
  Gate gate;
  std::atomic<bool> slow_done{false};
  std::atomic<bool> waited_too_little{false};
  backend_->enqueue_host_function(slow, gate.blocker());
  backend_->enqueue_host_function(slow, [&] { slow_done = true; });
  backend_->record_event(event, slow);
  backend_->stream_wait_event(waiter, event);  // waits for the slow stream's recording
  backend_->record_event(event, idle);         // a later recording that completes at once
  backend_->synchronize_stream(idle);
  backend_->enqueue_host_function(waiter, [&] { waited_too_little = !slow_done.load(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  gate.open();
  backend_->synchronize_stream(waiter);
  EXPECT_FALSE(waited_too_little.load());
  backend_->destroy_event(event);
  for (const Stream stream : {slow, idle, waiter}) backend_->destroy_stream(stream);
}

TEST_P(BackendConformance, RecordingAndWaitingRaceWithoutDeadlock) {
  // Two threads: one records the event on a stream again and again, the other makes the same
  // stream wait for it. Every wait must find its recording already queued.
  const Stream stream = backend_->create_stream();
  const Event event = backend_->create_event();
  std::atomic<bool> stop{false};
  std::thread recorder([&] {
    while (!stop.load()) backend_->record_event(event, stream);
  });
  for (int i = 0; i < 3000; ++i) backend_->stream_wait_event(stream, event);
  stop = true;
  recorder.join();
  backend_->synchronize_stream(stream);
  EXPECT_TRUE(backend_->query_event(event));
  backend_->destroy_event(event);
  backend_->destroy_stream(stream);
}

TEST_P(BackendConformance, StreamWaitsForAnEventOfAnotherStream) {
  SKIP_IF_SYNCHRONOUS();
  const Stream producer = backend_->create_stream();
  const Stream consumer = backend_->create_stream();
  const Event ready = backend_->create_event();
  Gate gate;
  std::atomic<bool> produced{false};
  std::atomic<bool> consumed_early{false};
  backend_->enqueue_host_function(producer, gate.blocker());
  backend_->enqueue_host_function(producer, [&] { produced = true; });
  backend_->record_event(ready, producer);
  backend_->stream_wait_event(consumer, ready);
  backend_->enqueue_host_function(consumer, [&] { consumed_early = !produced.load(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  gate.open();
  backend_->synchronize_stream(consumer);
  EXPECT_TRUE(produced.load());
  EXPECT_FALSE(consumed_early.load()) << "the consumer ran before the event it waited for";
  backend_->destroy_event(ready);
  backend_->destroy_stream(producer);
  backend_->destroy_stream(consumer);
}

TEST_P(BackendConformance, DestroyingAStreamFinishesItsWork) {
  const Stream stream = backend_->create_stream();
  std::atomic<int> ran{0};
  for (int i = 0; i < 8; ++i) {
    backend_->enqueue_host_function(stream, [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ++ran;
    });
  }
  backend_->destroy_stream(stream);
  EXPECT_EQ(ran.load(), 8);
}

TEST_P(BackendConformance, DefaultStreamCannotBeDestroyed) {
  EXPECT_THROW(backend_->destroy_stream(Stream{0}), LogicError);
}

TEST_P(BackendConformance, TimingEventsMeasureTheWorkBetweenThem) {
  void* segment = backend_->try_allocate_segment(8 * kMiB);
  ASSERT_NE(segment, nullptr);
  const Stream stream = backend_->create_stream();
  const Event start = backend_->create_timing_event();
  const Event end = backend_->create_timing_event();
  const Event plain = backend_->create_event();
  backend_->record_event(start, stream);
  backend_->memset_async(segment, 1, 8 * kMiB, stream);
  backend_->record_event(end, stream);
  backend_->record_event(plain, stream);
  backend_->synchronize_event(plain);
  EXPECT_GE(backend_->elapsed_seconds(start, end), 0.0);
  EXPECT_LE(backend_->elapsed_seconds(end, start), 0.0);
  EXPECT_THROW(backend_->elapsed_seconds(start, plain), LogicError);  // no timing kept
  backend_->destroy_event(start);
  backend_->destroy_event(end);
  backend_->destroy_event(plain);
  backend_->destroy_stream(stream);
  backend_->free_segment(segment);
}

TEST_P(BackendConformance, MemsetAndDeviceToDeviceCopy) {
  void* source = backend_->try_allocate_segment(kMiB);
  void* target = backend_->try_allocate_segment(kMiB);
  ASSERT_TRUE(source && target);
  backend_->memset_async(source, 0x5A, kMiB, Stream{0});
  backend_->copy_async(target, source, kMiB, Stream{0});
  EXPECT_EQ(read(target, kMiB), std::vector<std::uint8_t>(kMiB, 0x5A));
  backend_->free_segment(source);
  backend_->free_segment(target);
}

TEST_P(BackendConformance, PinnedMemoryRoundTripsThroughTheDevice) {
  const std::size_t bytes = 2 * kMiB;
  auto* pinned = static_cast<std::uint8_t*>(backend_->try_allocate_pinned(bytes));
  ASSERT_NE(pinned, nullptr);
  const auto data = pattern(bytes, 31);
  std::memcpy(pinned, data.data(), bytes);
  void* segment = backend_->try_allocate_segment(bytes);
  ASSERT_NE(segment, nullptr);
  const Stream stream = backend_->create_stream();
  backend_->copy_async(segment, pinned, bytes, stream);
  backend_->synchronize_stream(stream);
  std::memset(pinned, 0, bytes);
  backend_->copy_async(pinned, segment, bytes, stream);
  backend_->synchronize_stream(stream);
  EXPECT_EQ(std::memcmp(pinned, data.data(), bytes), 0);
  backend_->destroy_stream(stream);
  backend_->free_segment(segment);
  backend_->free_pinned(pinned);
}

TEST_P(BackendConformance, RegisteredHostMemoryRoundTripsThroughTheDevice) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t bytes = 2 * kMiB;
  void* host = std::aligned_alloc(page, bytes);
  ASSERT_NE(host, nullptr);
  ASSERT_TRUE(backend_->try_register_host(host, bytes));
  EXPECT_THROW(backend_->try_register_host(host, bytes), LogicError);  // pinned already
  const auto data = pattern(bytes, 47);
  std::memcpy(host, data.data(), bytes);
  void* segment = backend_->try_allocate_segment(bytes);
  ASSERT_NE(segment, nullptr);
  const Stream stream = backend_->create_stream();
  backend_->copy_async(segment, host, bytes, stream);
  backend_->synchronize_stream(stream);
  std::memset(host, 0, bytes);
  backend_->copy_async(host, segment, bytes, stream);
  backend_->synchronize_stream(stream);
  EXPECT_EQ(std::memcmp(host, data.data(), bytes), 0);
  backend_->destroy_stream(stream);
  backend_->free_segment(segment);
  backend_->unregister_host(host);
  std::free(host);
}

}  // namespace stowage::testing
