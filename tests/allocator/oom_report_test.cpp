// The out-of-memory message (Note [OOM message]): torch's opening, then the one cause that applies.
#include "allocator/oom_report.hpp"

#include <gtest/gtest.h>

#include <string>

#include "base/byte_units.hpp"

namespace stowage {
namespace {

constexpr std::size_t KiB = kKiB;
constexpr std::size_t MiB = kMiB;
constexpr std::size_t GiB = kGiB;

std::size_t mib(double value) { return static_cast<std::size_t>(value * static_cast<double>(MiB)); }

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(OomReportTest, SizesAreWrittenAsTorchWritesThem) {
  EXPECT_EQ(format_size_as_torch(0), "0 bytes");
  EXPECT_EQ(format_size_as_torch(1024), "1024 bytes");
  EXPECT_EQ(format_size_as_torch(1025), "1.00 KiB");
  EXPECT_EQ(format_size_as_torch(672 * KiB), "672.00 KiB");
  EXPECT_EQ(format_size_as_torch(MiB), "1024.00 KiB");
  EXPECT_EQ(format_size_as_torch(20 * MiB), "20.00 MiB");
  EXPECT_EQ(format_size_as_torch(GiB), "1024.00 MiB");
  EXPECT_EQ(format_size_as_torch(std::size_t{800000000} * GiB), "800000000.00 GiB");
}

// A 24 GiB limit on a 140 GiB device: the limit refused the request, though the device had room
// and the cache a little free. The cap comes first; no fragmentation is claimed.
TEST(OomReportTest, UnderACapTheCapComesFirstAndIsWhatRefused) {
  OomReport report;
  report.requested = report.rounded = GiB;
  report.device_total = static_cast<std::size_t>(139.80 * static_cast<double>(GiB));
  report.device_free = static_cast<std::size_t>(116.39 * static_cast<double>(GiB));
  report.limit = 24 * GiB;
  report.cap = "the allocator's limit";
  report.reserved = 24 * GiB - 2 * MiB;
  report.reserved_unallocated = mib(30.76);
  report.allocated = report.reserved - report.reserved_unallocated;
  report.largest_free_block = report.largest_usable_block = mib(1.6);
  report.describe();
  const std::string& m = report.message;
  EXPECT_EQ(m.rfind("CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of "
                    "139.80 GiB of which 116.39 GiB is free. 24.00 GiB allowed; Of the allocated memory ",
                    0),
            0u)
      << m;
  EXPECT_TRUE(has(m, " out of memory.")) << "what accelerate's should_reduce_batch_size looks for";
  const std::size_t explanation = m.find("stowage:");
  ASSERT_NE(explanation, std::string::npos) << m;
  EXPECT_EQ(m.find(" The cap is 24.00 GiB, the allocator's limit", explanation),
            explanation + std::string("stowage:").size())
      << m;
  EXPECT_TRUE(has(m, "The cap refused it")) << m;
  EXPECT_FALSE(has(m, "fragmentation")) << m;
}

// CPU mode, 108.81 of 112 MiB allocated, nothing free on the device: 3.19 MiB free in the cache
// would hold 672 KiB, but no free block of the request's class and stream does.
TEST(OomReportTest, FreeBytesOfTheCacheInPiecesTooSmallAreFragmentation) {
  OomReport report;
  report.kind = "CPU";
  report.holder = "The simulated device";
  report.requested = report.rounded = 672 * KiB;
  report.device_total = report.limit = 112 * MiB;
  report.cap = "the device's memory";
  report.device_free = 0;
  report.reserved = 112 * MiB;
  report.allocated = mib(108.81);
  report.reserved_unallocated = report.reserved - report.allocated;
  report.largest_free_block = mib(1.78);
  report.largest_usable_block = 512 * KiB;
  report.describe();
  const std::string& m = report.message;
  EXPECT_EQ(m.rfind("CPU out of memory. Tried to allocate 672.00 KiB. The simulated device has a total "
                    "capacity of 112.00 MiB of which 0 bytes is free. Of the allocated memory ",
                    0),
            0u)
      << m;
  EXPECT_TRUE(has(m, "this is fragmentation")) << m;
  EXPECT_TRUE(has(m, "the largest free block this request can use is 512.00 KiB")) << m;
  EXPECT_TRUE(has(m, "a free block of 1.78 MiB serves the other size class or another stream")) << m;
  EXPECT_FALSE(has(m, "allowed;")) << "no cap below the device";
  EXPECT_FALSE(has(m, "neither")) << m;
}

// 126 of 160 MiB allocated, 30 MiB free on the device and 4 MiB in the cache, 32 MiB asked: each
// kind alone is short, so live blocks hold the memory, whatever the two add up to.
TEST(OomReportTest, WhenNeitherKindHoldsItAloneLiveBlocksHoldTheMemory) {
  OomReport report;
  report.requested = report.rounded = 32 * MiB;
  report.device_total = report.limit = 160 * MiB;
  report.cap = "the device's memory";
  report.device_free = 30 * MiB;
  report.reserved = 130 * MiB;
  report.allocated = 126 * MiB;
  report.reserved_unallocated = 4 * MiB;
  report.largest_free_block = report.largest_usable_block = 2 * MiB;
  report.describe();
  const std::string& m = report.message;
  EXPECT_TRUE(has(m, "Live blocks hold the memory")) << m;
  EXPECT_TRUE(has(m, "the request is 2.00 MiB more than the larger")) << m;
  EXPECT_FALSE(has(m, "fragmentation")) << m;
}

TEST(OomReportTest, ARequestLargerThanTheCapOrTheDeviceSaysSo) {
  OomReport report;
  report.requested = report.rounded = 40 * GiB;
  report.device_total = 80 * GiB;
  report.device_free = 79 * GiB;
  report.limit = 24 * GiB;
  report.cap = "torch's per-process memory fraction (0.30)";
  report.describe();
  EXPECT_TRUE(has(report.message, "The request is larger than the cap: raise torch's per-process memory "
                                  "fraction (0.30)"))
      << report.message;
  report.requested = report.rounded = 90 * GiB;
  report.describe();
  EXPECT_TRUE(has(report.message, "The request is larger than all of GPU 0")) << report.message;
}

}  // namespace
}  // namespace stowage
