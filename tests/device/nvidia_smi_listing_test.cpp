// nvidia-smi's CSV listing read into the GPUs `stowage doctor` shows: the rows it prints, and the
// edge cases a driver or a broken installation may print instead.
#include "device/nvidia_smi_listing.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace stowage {
namespace {

TEST(NvidiaSmiListing, ReadsEachRowInOrder) {
  const auto gpus = nvidia_smi_gpus(
      "0, NVIDIA H100 80GB HBM3, 81559, 00000000:19:00.0, 9.0\n"
      "1, NVIDIA A100-SXM4-40GB, 40960, 00000000:3B:00.0, 8.0\n");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_EQ(gpus[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(gpus[0].total_memory, std::uint64_t{81559} << 20);
  EXPECT_EQ(gpus[0].pci_bus_id, "00000000:19:00.0");
  EXPECT_EQ(gpus[0].compute_capability, "9.0");
  EXPECT_FALSE(gpus[0].virtual_memory_management.has_value());
  EXPECT_EQ(gpus[1].index, 1);
  EXPECT_EQ(gpus[1].pci_bus_id, "00000000:3B:00.0");
}

TEST(NvidiaSmiListing, SkipsRowsOfTheWrongWidth) {
  const auto gpus = nvidia_smi_gpus(
      "No devices were found\n"
      "\n"
      "0, GPU, 1024, 0000:01:00.0\n"
      "0, GPU, 1024, 0000:01:00.0, 8.6, extra\n"
      "3, Tesla T4, 15360, 00000000:00:04.0, 7.5\r\n");
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].index, 3);
  EXPECT_EQ(gpus[0].compute_capability, "7.5");
}

TEST(NvidiaSmiListing, NonNumericMemoryIsUnknown) {
  const auto gpus = nvidia_smi_gpus("0, GPU, [N/A], 0000:01:00.0, 8.6\n1, GPU, -5, [N/A], 8.6\n"
                                    "2, GPU, 99999999999999999999, x, 8.6\n3, GPU, 17592186044416, x, 8.6\n");
  ASSERT_EQ(gpus.size(), 4u);
  for (const GpuFacts& gpu : gpus) EXPECT_FALSE(gpu.total_memory.has_value()) << gpu.index;
  EXPECT_EQ(gpus[1].pci_bus_id, "[N/A]");  // kept as printed: the NUMA lookup leaves it out
}

TEST(NvidiaSmiListing, BadComputeCapabilityIsUnknown) {
  const auto gpus = nvidia_smi_gpus("0, a, 1, b, [N/A]\n1, a, 1, b, 9\n2, a, 1, b, 9.\n3, a, 1, b, .0\n"
                                    "4, a, 1, b, 9.0a\n5, a, 1, b, 10.0\n");
  ASSERT_EQ(gpus.size(), 6u);
  for (std::size_t i = 0; i < 5; ++i) EXPECT_FALSE(gpus[i].compute_capability.has_value()) << i;
  EXPECT_EQ(gpus[5].compute_capability, "10.0");
}

TEST(NvidiaSmiListing, AnIndexThatIsNoNumberIsTheRowsPosition) {
  const auto gpus = nvidia_smi_gpus("0, a, 1, b, 8.0\nbad, a, 1, b, 8.0\n-1, a, 1, b, 8.0\n");
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus[1].index, 1);
  EXPECT_EQ(gpus[2].index, 2);
}

TEST(NvidiaSmiListing, QuotedFieldsMayHoldCommasAndQuotes) {
  const auto gpus = nvidia_smi_gpus("0, \"GPU, \"\"special\"\"\", 2048, 0000:01:00.0, 8.9\n");
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].name, "GPU, \"special\"");
  EXPECT_EQ(gpus[0].total_memory, std::uint64_t{2048} << 20);
}

TEST(NvidiaSmiListing, EmptyTextListsNoGpu) {
  EXPECT_TRUE(nvidia_smi_gpus("").empty());
  EXPECT_TRUE(nvidia_smi_gpus("\n\n").empty());
}

}  // namespace
}  // namespace stowage
