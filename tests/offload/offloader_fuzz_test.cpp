// A random walk over the offloader: offloads, reloads on the host and on a stream, drops, polls,
// pressure relief and synchronisation in random order; after every step the buffer table, the
// pool and the device allocator are consistent, and every reload brings back the bytes offloaded
// out. At the end everything returns to where it started.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "offload/offloader.hpp"
#include "tests/offload/offloader_harness.hpp"

namespace stowage {
namespace {

using testing::OffloaderHarness;
using testing::OffloaderHarnessOptions;
using testing::pattern;

struct LiveBuffer {
  std::size_t bytes = 0;
  std::uint32_t seed = 0;
};

class OffloaderWalk {
 public:
  OffloaderWalk(OffloaderHarness& harness, std::uint32_t seed)
      : harness_(harness), random_(seed), host_(harness.backend()),
        stream_(harness.backend().create_stream()), device_(harness.backend(), stream_) {}
  ~OffloaderWalk() { harness_.backend().destroy_stream(stream_); }

  void step() {
    switch (std::uniform_int_distribution<int>(0, 9)(random_)) {
      case 0: case 1: case 2: offload(); break;
      case 3: case 4: case 5: reload(); break;
      case 6: case 7: drop(); break;
      case 8: harness_.offloader().poll(); break;
      default:
        if (random_() % 2 == 0) {
          harness_.offloader().relieve_pressure(random_() % (8 * kMiB), Stream{});
        } else {
          harness_.offloader().synchronize();
        }
    }
    harness_.offloader().check_invariants();
    harness_.engine().pool().check_invariants();
    harness_.allocator().check_invariants();
  }

  void drop_all() {
    for (const auto& [id, buffer] : live_) harness_.offloader().drop(id);
    live_.clear();
  }

 private:
  ComputeTimeline& timeline() {
    return random_() % 2 == 0 ? static_cast<ComputeTimeline&>(host_) : device_;
  }

  void offload() {
    const std::size_t bytes = std::uniform_int_distribution<std::size_t>(1, kMiB)(random_);
    const auto seed = static_cast<std::uint32_t>(random_());
    const auto id = harness_.offloader().offload(harness_.filled(bytes, seed), timeline());
    ASSERT_TRUE(id.has_value());
    live_[*id] = {bytes, seed};
  }

  void reload() {
    if (live_.empty()) return;
    auto it = live_.begin();
    std::advance(it, static_cast<long>(random_() % live_.size()));
    ComputeTimeline& compute = timeline();
    const DeviceBuffer buffer = harness_.offloader().reload(it->first, compute);
    ASSERT_EQ(buffer.bytes, it->second.bytes);
    // Read as the compute would: after the reload, on the compute's timeline.
    std::vector<std::uint8_t> seen(buffer.bytes);
    const Stream on = &compute == &device_ ? stream_ : Stream{0};
    harness_.backend().copy_async(seen.data(), buffer.data, buffer.bytes, on);
    harness_.backend().synchronize_stream(on);
    ASSERT_EQ(seen, pattern(it->second.bytes, it->second.seed)) << "buffer " << it->first;
  }

  void drop() {
    if (live_.empty()) return;
    auto it = live_.begin();
    std::advance(it, static_cast<long>(random_() % live_.size()));
    harness_.offloader().drop(it->first);
    live_.erase(it);
  }

  OffloaderHarness& harness_;
  std::mt19937 random_;
  HostThreadTimeline host_;
  Stream stream_;
  DeviceStreamTimeline device_;
  std::map<Offloader::OffloadId, LiveBuffer> live_;
};

TEST(OffloaderFuzz, ARandomWalkKeepsEveryBufferAndEveryAccount) {
  for (const std::optional<std::size_t> prefetch : {std::optional<std::size_t>{},
                                                   std::optional<std::size_t>{3}}) {
    OffloaderHarnessOptions options;
    options.capacity = 512 * kMiB;
    options.prefetch = prefetch;
    OffloaderHarness harness(options);
    const std::int64_t baseline = harness.device_allocated();
    {
      OffloaderWalk walk(harness, prefetch.has_value() ? 11u : 29u);
      for (int i = 0; i < 1500 && !::testing::Test::HasFatalFailure(); ++i) walk.step();
      walk.drop_all();
    }
    harness.offloader().synchronize();
    harness.offloader().check_invariants();
    EXPECT_EQ(harness.device_allocated(), baseline);
    EXPECT_EQ(harness.engine().pool().stats().allocated_bytes, 0);
    EXPECT_EQ(harness.offloader().stats().offloaded_bytes.current, 0);
  }
}

}  // namespace
}  // namespace stowage
