// The transfer engine: copies on its own streams after the events they follow, timed on the
// device, with completion events recycled once no copy uses them.
#include "offload/transfer_engine.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "base/byte_units.hpp"
#include "device/host/host_backend.hpp"
#include "tests/conformance/pattern.hpp"
#include "tests/support/gate.hpp"

namespace stowage {
namespace {

using testing::Gate;
using testing::pattern;

HostBackendOptions device_options(double bandwidth = 0) {
  HostBackendOptions options;
  options.capacity_bytes = 256 * kMiB;
  options.copy_bytes_per_second = bandwidth;
  return options;
}

TEST(TransferEngine, CopiesOutAndBackAreCountedAndTimedOnTheDevice) {
  // Slow enough that the copy's time is the link's, even where memcpy is instrumented (TSan).
  constexpr double kBandwidth = 2e8;  // bytes per second
  HostBackend backend(device_options(kBandwidth));
  TransferEngine engine(backend);
  const std::size_t bytes = 4 * kMiB;
  void* device = backend.try_allocate_segment(bytes);
  const auto data = pattern(bytes, 3);
  backend.copy_async(device, data.data(), bytes, Stream{0});
  backend.synchronize_device();
  std::vector<std::uint8_t> host(bytes);
  const auto before_copy = std::chrono::steady_clock::now();
  const TransferHandle out = engine.copy(TransferDirection::kToHost, host.data(), device, bytes, {});
  engine.wait(out);
  const std::chrono::duration<double> copy_wall = std::chrono::steady_clock::now() - before_copy;
  EXPECT_EQ(host, data);
  std::memset(host.data(), 0, 16);
  host[0] = 0xAB;
  const TransferHandle in = engine.copy(TransferDirection::kToDevice, device, host.data(), bytes, {});
  engine.synchronize();
  EXPECT_TRUE(engine.done(in));
  const TransferStats stats = engine.stats();
  EXPECT_EQ(stats.num_to_host, 1);
  EXPECT_EQ(stats.num_to_device, 1);
  EXPECT_EQ(stats.bytes_to_host, static_cast<std::int64_t>(bytes));
  EXPECT_EQ(stats.completed_bytes_to_device, static_cast<std::int64_t>(bytes));
  // The simulated link moves 200 MB/s: the copy's device time is at least the link's and at most
  // the wall time the host spent from enqueueing it to seeing it done (however busy the machine).
  EXPECT_GE(stats.bandwidth(TransferDirection::kToHost), bytes / copy_wall.count());
  EXPECT_LT(stats.bandwidth(TransferDirection::kToHost), 1.1 * kBandwidth);
  EXPECT_EQ(stats.num_syncs, 2) << "wait and synchronize each blocked once";
  backend.free_segment(device);
}

TEST(TransferEngine, ACopyRunsOnlyAfterTheEventItFollows) {
  HostBackend backend(device_options());
  TransferEngine engine(backend);
  const Stream compute = backend.create_stream();
  Gate producer;  // the compute that writes the source has not run yet
  backend.enqueue_host_function(compute, producer.blocker());
  std::vector<std::uint8_t> source(kMiB, 1);
  backend.enqueue_host_function(compute, [&] { std::memset(source.data(), 7, source.size()); });
  const Event produced = engine.borrow_event();
  backend.record_event(produced, compute);
  std::vector<std::uint8_t> target(kMiB, 0);
  const TransferHandle copy =
      engine.copy(TransferDirection::kToHost, target.data(), source.data(), kMiB, produced);
  engine.recycle_event(produced);  // the copy's wait keeps the recording it saw
  EXPECT_FALSE(engine.done(copy));
  producer.open();
  engine.wait(copy);
  EXPECT_EQ(target, std::vector<std::uint8_t>(kMiB, 7)) << "copied before the producer ran";
  backend.destroy_stream(compute);
}

TEST(TransferEngine, AStallIsMeasuredFromWhereTheComputeWaits) {
  HostBackend backend(device_options(/*bandwidth=*/1e9));
  TransferEngine engine(backend);
  const Stream compute = backend.create_stream();
  std::vector<std::uint8_t> host(8 * kMiB, 1);
  void* device = backend.try_allocate_segment(host.size());
  // The compute reaches its wait first, so however the threads are scheduled the stall holds the
  // whole copy.
  const Event arrival = engine.borrow_event();
  backend.record_event(arrival, compute);
  const TransferHandle copy =
      engine.copy(TransferDirection::kToDevice, device, host.data(), host.size(), {});
  backend.stream_wait_event(compute, copy->finished());
  backend.synchronize_stream(compute);
  const std::optional<double> stall = engine.seconds_after(arrival, copy);
  ASSERT_TRUE(stall.has_value());
  EXPECT_GT(*stall, 0.004) << "8 MiB at 1 GB/s takes 8 ms, all of it waited for";
  engine.recycle_event(arrival);
  backend.free_segment(device);
  backend.destroy_stream(compute);
}

TEST(TransferEngine, EventsAreReusedOnceTheirCopiesComplete) {
  HostBackend backend(device_options());
  TransferEngine engine(backend);
  std::vector<std::uint8_t> a(4096, 1);
  std::vector<std::uint8_t> b(4096, 0);
  const std::uint64_t before = backend.faults().calls(BackendCall::kCreateEvent);
  for (int i = 0; i < 200; ++i) {
    TransferHandle copy = engine.copy(TransferDirection::kToHost, b.data(), a.data(), a.size(), {});
    engine.wait(copy);
  }
  engine.poll();
  EXPECT_LE(backend.faults().calls(BackendCall::kCreateEvent) - before, 8u)
      << "each copy made new events";
}

TEST(TransferEngine, ATransferDroppedEarlyKeepsItsEventsUntilItCompletes) {
  HostBackend backend(device_options());
  TransferEngine engine(backend);
  Gate gate;
  backend.enqueue_host_function(engine.stream(TransferDirection::kToHost), gate.blocker());
  std::vector<std::uint8_t> a(4096, 1);
  std::vector<std::uint8_t> b(4096, 0);
  engine.copy(TransferDirection::kToHost, b.data(), a.data(), a.size(), {}).reset();
  // The copy is still queued: a new copy must not get its events.
  const TransferHandle next = engine.copy(TransferDirection::kToHost, b.data(), a.data(), 16, {});
  EXPECT_FALSE(engine.done(next));
  gate.open();
  engine.wait(next);
  EXPECT_EQ(b[4095], 1);
}

}  // namespace
}  // namespace stowage
