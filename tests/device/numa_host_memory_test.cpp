// Host memory near a GPU: bound to its NUMA nodes where hwloc can place it, plain memory (with
// the reason) where it cannot.
#include "device/numa_host_memory.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "device/numa_topology.hpp"

namespace stowage {
namespace {

// Allocates, checks the memory is page-aligned, zeroed and writable, and frees it.
void expect_usable(NumaHostMemory& memory, std::size_t bytes) {
  auto* ptr = static_cast<std::uint8_t*>(memory.try_allocate(bytes));
  ASSERT_NE(ptr, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ptr) % NumaHostMemory::page_size(), 0u);
  EXPECT_EQ(ptr[0], 0);
  EXPECT_EQ(ptr[bytes - 1], 0);
  std::memset(ptr, 0x5A, bytes);
  EXPECT_EQ(ptr[bytes / 2], 0x5A);
  memory.free(ptr, bytes);
}

TEST(NumaHostMemory, WithoutADeviceTheMemoryIsUnboundAndSaysWhy) {
  NumaHostMemory memory = NumaHostMemory::near_device("");
  EXPECT_TRUE(memory.nodes().empty());
  EXPECT_NE(memory.placement().find("no PCI device"), std::string::npos) << memory.placement();
  expect_usable(memory, 3 * kMiB + 5);
}

TEST(NumaHostMemory, ADeviceHwlocDoesNotListLeavesTheMemoryUnbound) {
  NumaHostMemory memory = NumaHostMemory::near_device("0000:ff:1f.7");
  if (!memory.nodes().empty()) GTEST_SKIP() << "this machine has a device at 0000:ff:1f.7";
  EXPECT_EQ(memory.placement().rfind("anywhere (", 0), 0u) << memory.placement();
  expect_usable(memory, kMiB);
}

TEST(NumaHostMemory, ABadBusIdIsRefused) {
  EXPECT_THROW(NumaHostMemory::near_device("gpu0"), LogicError);
}

TEST(NumaHostMemory, MemoryBoundToANodeOfThisProcessIsUsable) {
  const NumaTopology topology = read_numa_topology({});
  ASSERT_FALSE(topology.process_numa_nodes.empty());
  NumaHostMemory memory = NumaHostMemory::on_nodes({topology.process_numa_nodes.front()});
  expect_usable(memory, 4 * kMiB);
  // Bound, or (a container that refuses mbind) unbound with the kernel's reason.
  if (memory.nodes().empty()) {
    EXPECT_NE(memory.placement().find("refused"), std::string::npos) << memory.placement();
  } else {
    EXPECT_EQ(memory.placement(),
              "NUMA node " + std::to_string(topology.process_numa_nodes.front()));
  }
}

TEST(NumaHostMemory, ARequestBeyondAnyHostFailsSoftly) {
  NumaHostMemory memory = NumaHostMemory::near_device("");
  EXPECT_EQ(memory.try_allocate(std::size_t{1} << 60), nullptr);
}

}  // namespace
}  // namespace stowage
