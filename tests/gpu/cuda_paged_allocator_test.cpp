// The caching allocator's paged path (Note [Paged path]) on a real GPU: pages mapped with the
// driver's virtual-memory calls, blocks sharing pages, stitching of free pages into one range,
// data intact across moves, release. Skips without a GPU or without virtual memory support.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "allocator/caching_allocator.hpp"
#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "device/cuda/cuda_backend.hpp"

namespace stowage {
namespace {

constexpr std::size_t MiB = kMiB;

class CudaPagedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no GPU";
    backend_ = open_cuda_device(0);
    if (!backend_->properties().virtual_memory) GTEST_SKIP() << "no virtual memory management";
  }

  // Fills `bytes` at ptr with `value` on the device and reads back the first and last byte.
  std::pair<unsigned char, unsigned char> fill_and_read(void* ptr, std::size_t bytes, int value) {
    backend_->memset_async(ptr, value, bytes, Stream{0});
    unsigned char first = 0;
    unsigned char last = 0;
    auto* bytes_ptr = static_cast<unsigned char*>(ptr);
    backend_->copy_async(&first, bytes_ptr, 1, Stream{0});
    backend_->copy_async(&last, bytes_ptr + bytes - 1, 1, Stream{0});
    backend_->synchronize_stream(Stream{0});
    return {first, last};
  }

  std::unique_ptr<DeviceBackend> backend_;
};

TEST_F(CudaPagedTest, BlocksSharePagesAndAreUsable) {
  CachingAllocator allocator(*backend_, parse_allocator_config("virtual_memory:on"));
  const std::size_t page = backend_->properties().granularity;
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(allocator.malloc(3 * MiB));
  EXPECT_EQ(allocator.stats().reserved_bytes.all().current,
            static_cast<std::int64_t>(round_up(9 * MiB, page)));
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto [first, last] = fill_and_read(blocks[i], 3 * MiB, static_cast<int>(i + 1));
    EXPECT_EQ(first, i + 1);
    EXPECT_EQ(last, i + 1);
  }
  for (void* block : blocks) allocator.free(block);
  allocator.check_invariants();
  allocator.empty_cache();
  EXPECT_EQ(allocator.stats().reserved_bytes.all().current, 0);
}

TEST_F(CudaPagedTest, FreePagesAreStitchedAndLiveDataSurvives) {
  const std::size_t page = backend_->properties().granularity;
  // A limit makes the allocator move pages instead of creating them.
  CachingAllocator allocator(*backend_,
                             parse_allocator_config("virtual_memory:on,limit:" +
                                                    std::to_string(34 * page)));
  std::vector<void*> keep;
  std::vector<void*> drop;
  for (int i = 0; i < 8; ++i) {
    keep.push_back(allocator.malloc(page - 4096));
    fill_and_read(keep.back(), page - 4096, 0x20 + i);
    drop.push_back(allocator.malloc(3 * page));
  }
  for (void* block : drop) allocator.free(block);
  const auto unmaps = allocator.stats().num_unmaps;
  void* stitched = allocator.malloc(12 * page);
  EXPECT_GT(allocator.stats().num_unmaps, unmaps) << "pages were moved";
  const auto [first, last] = fill_and_read(stitched, 12 * page, 0x7F);
  EXPECT_EQ(first, 0x7F);
  EXPECT_EQ(last, 0x7F);
  for (int i = 0; i < 8; ++i) {
    unsigned char probe = 0;
    backend_->copy_async(&probe,
                         static_cast<unsigned char*>(keep[static_cast<std::size_t>(i)]) + page / 2,
                         1, Stream{0});
    backend_->synchronize_stream(Stream{0});
    EXPECT_EQ(probe, 0x20 + i) << "live block " << i;
  }
  allocator.free(stitched);
  for (void* block : keep) allocator.free(block);
  allocator.check_invariants();
}

// A block of a created stream, used on the default stream (torch's usual stream) and freed while
// that stream is busy, is not handed out again until the default stream is past the use; on
// both paths, with a host function holding Stream{0} for 300 ms.
TEST_F(CudaPagedTest, RecordStreamOnTheDefaultStreamHoldsTheBlock) {
  for (const char* config : {"virtual_memory:off", "virtual_memory:on"}) {
    CachingAllocator allocator(*backend_, parse_allocator_config(config));
    const Stream side = backend_->create_stream();
    void* x = allocator.malloc(16 * MiB, side);
    backend_->enqueue_host_function(Stream{0}, [] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    });
    allocator.record_stream(x, Stream{0});
    allocator.free(x);
    EXPECT_EQ(allocator.stats().active_bytes.all().current, static_cast<std::int64_t>(16 * MiB))
        << config << ": the free did not wait for the default stream";
    void* y = allocator.malloc(16 * MiB, side);
    EXPECT_NE(y, x) << config << ": reused while the default stream may still use it";
    backend_->synchronize_device();
    allocator.free(y);
    void* z = allocator.malloc(16 * MiB, side);  // collects the completed event
    allocator.free(z);
    EXPECT_EQ(allocator.stats().active_bytes.all().current, 0) << config;
    allocator.empty_cache();
    allocator.check_invariants();
    backend_->destroy_stream(side);
  }
}

// Learned placement (Note [Learned placement]) on real virtual memory: marked steps of a
// training shape are placed by their layout, every block keeps its value until it is freed, and
// once the arena is open no page is mapped or unmapped. The segment path, the other way to
// run without the paged path, serves the same steps with the same data checks.
TEST_F(CudaPagedTest, LearnedPlacementPlacesMarkedStepsAndLiveDataSurvives) {
  std::vector<std::size_t> sizes;
  for (std::size_t i = 0; i < 24; ++i) sizes.push_back((3 + (i * 7) % 11) * MiB + 4096 * i + 512);
  auto value_of = [](std::size_t step, std::size_t i) {
    return static_cast<int>(1 + (step * 31 + i) % 250);
  };
  for (const char* config : {"virtual_memory:on,placement:learned", "virtual_memory:off"}) {
    CachingAllocator allocator(*backend_, parse_allocator_config(config));
    std::int64_t maps_when_warm = -1;
    std::int64_t unmaps_when_warm = -1;
    for (std::size_t step = 0; step < 8; ++step) {
      if (step == 4) {
        maps_when_warm = allocator.stats().num_maps;
        unmaps_when_warm = allocator.stats().num_unmaps;
      }
      std::vector<void*> saved;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        void* temporary = allocator.malloc(sizes[i] / 2 + MiB);
        backend_->memset_async(temporary, 0xEE, sizes[i] / 2 + MiB, Stream{0});
        saved.push_back(allocator.malloc(sizes[i]));
        backend_->memset_async(saved.back(), value_of(step, i), sizes[i], Stream{0});
        allocator.free(temporary);
      }
      for (std::size_t i = sizes.size(); i-- > 0;) {
        unsigned char first = 0;
        unsigned char last = 0;
        auto* bytes = static_cast<unsigned char*>(saved[i]);
        backend_->copy_async(&first, bytes, 1, Stream{0});
        backend_->copy_async(&last, bytes + sizes[i] - 1, 1, Stream{0});
        backend_->synchronize_stream(Stream{0});
        ASSERT_EQ(first, value_of(step, i)) << config << " step " << step << " block " << i;
        ASSERT_EQ(last, value_of(step, i)) << config << " step " << step << " block " << i;
        allocator.free(saved[i]);
      }
      allocator.mark_step();
      allocator.check_invariants();
    }
    if (std::string(config).find("learned") != std::string::npos) {
      const CachingAllocator::PlacementStatus status = allocator.placement_status();
      EXPECT_GE(status.layouts_made, 1u);
      EXPECT_EQ(status.departures, 0);
      EXPECT_GE(status.placed_allocations, 4u * 2 * sizes.size()) << "steps 4 to 7 placed";
      EXPECT_EQ(allocator.stats().num_maps, maps_when_warm);
      EXPECT_EQ(allocator.stats().num_unmaps, unmaps_when_warm);
    }
    allocator.empty_cache();
    EXPECT_EQ(allocator.stats().reserved_bytes.all().current, 0) << config;
  }
}

}  // namespace
}  // namespace stowage
