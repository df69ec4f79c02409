// The machine probes `stowage doctor` and the offloaded optimizer share: host memory (cgroup
// limits read from a directory laid out as the kernel's) and the CUDA driver and runtime
// (dlopen, so they answer on machines without either); and the doctor's advice drawn from them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "device/cuda_driver_probe.hpp"
#include "device/host_memory_probe.hpp"
#include "device/machine_advice.hpp"

namespace stowage {
namespace {

namespace fs = std::filesystem;

// A fake cgroup mount: the v2 files of this process's own cgroup, and the v1 memory controller.
class FakeCgroups : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("stowage-cgroups-" + std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "memory");
    std::ifstream groups("/proc/self/cgroup");
    std::string line;
    while (std::getline(groups, line)) {
      if (line.rfind("0::", 0) == 0) {
        own_ = root_ / fs::path(line.substr(3)).relative_path();
      }
    }
    if (own_.empty()) {
      GTEST_SKIP() << "this process has no v2 cgroup line in /proc/self/cgroup";
    }
    fs::create_directories(own_);
  }
  void TearDown() override { fs::remove_all(root_); }
  static void write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

  fs::path root_;
  fs::path own_;
};

TEST_F(FakeCgroups, V2RoomIsTheLimitLessTheUsage) {
  write(own_ / "memory.max", "1073741824\n");
  write(own_ / "memory.current", "268435456\n");
  EXPECT_EQ(read_host_memory(root_).cgroup_room_bytes, std::optional<std::uint64_t>(805306368));
}

TEST_F(FakeCgroups, V2MaxMeansNoLimitAndFallsToV1) {
  write(own_ / "memory.max", "max\n");
  write(own_ / "memory.current", "5\n");
  EXPECT_EQ(read_host_memory(root_).cgroup_room_bytes, std::nullopt);
  write(root_ / "memory" / "memory.limit_in_bytes", "1000\n");
  write(root_ / "memory" / "memory.usage_in_bytes", "1200\n");
  EXPECT_EQ(read_host_memory(root_).cgroup_room_bytes, std::optional<std::uint64_t>(0));  // over: no room
}

TEST_F(FakeCgroups, V1HugeLimitMeansNoLimit) {
  write(root_ / "memory" / "memory.limit_in_bytes", "9223372036854771712\n");
  write(root_ / "memory" / "memory.usage_in_bytes", "1\n");
  EXPECT_EQ(read_host_memory(root_).cgroup_room_bytes, std::nullopt);
}

TEST_F(FakeCgroups, MalformedFilesAreUnknownNotAnError) {
  write(own_ / "memory.max", "12abc\n");
  write(own_ / "memory.current", "\n");
  EXPECT_EQ(read_host_memory(root_).cgroup_room_bytes, std::nullopt);
}

TEST(HostMemoryProbe, ReadsThisMachine) {
  const HostMemoryFacts facts = read_host_memory();
  EXPECT_GT(facts.physical_bytes, 0U);
  ASSERT_TRUE(facts.available_bytes.has_value());  // Linux has had MemAvailable since 3.14
  EXPECT_LE(*facts.available_bytes, facts.physical_bytes);
}

TEST(HostRoom, TheSmallestLimitWinsAndIsNamed) {
  HostMemoryFacts facts;
  facts.available_bytes = 100;
  facts.cgroup_room_bytes = 60;
  facts.memlock_soft = 7;
  HostRoom room = host_room(facts, std::nullopt);
  EXPECT_EQ(room.available_bytes, 60U);
  EXPECT_EQ(room.limited_by, "the cgroup's memory limit");
  EXPECT_EQ(room.lockable_bytes, std::optional<std::uint64_t>(7));
  room = host_room(facts, 10);
  EXPECT_EQ(room.available_bytes, 10U);
  EXPECT_EQ(room.limited_by, "host_memory_limit");
  facts.cgroup_room_bytes.reset();
  EXPECT_EQ(host_room(facts, std::nullopt).limited_by, "available host memory (MemAvailable)");
}

TEST(HostRoom, NoLimitKnownIsSaid) {
  const HostRoom room = host_room(HostMemoryFacts{}, std::nullopt);
  EXPECT_EQ(room.available_bytes, std::uint64_t{1} << 62);
  EXPECT_EQ(room.limited_by, "nothing (no limit could be read)");
}

TEST(CudaProbes, VersionsReadAsCudaWritesThem) {
  EXPECT_EQ(cuda_version_text(12040), "12.4");
  EXPECT_EQ(cuda_version_text(13000), "13.0");
}

TEST(CudaProbes, ARuntimeThatDoesNotLoadIsSaid) {
  const CudaRuntimeFacts facts = probe_cuda_runtime({"/nonexistent/libcudart.so.99"});
  EXPECT_EQ(facts.library, std::nullopt);
  EXPECT_EQ(facts.error, std::optional<std::string>("no CUDA runtime (libcudart.so cannot be loaded)"));
}

TEST(CudaProbes, ALibraryWithoutTheEntryPointsIsSaid) {
  // libm loads everywhere and has none of the runtime's entry points.
  const CudaRuntimeFacts facts = probe_cuda_runtime({"/nonexistent.so", "libm.so.6"});
  EXPECT_EQ(facts.library, std::optional<std::string>("libm.so.6"));
  ASSERT_TRUE(facts.error.has_value());
  EXPECT_NE(facts.error->find("lacks"), std::string::npos);
}

TEST(CudaProbes, TheDriverAnswersOrSaysWhyNot) {
  const CudaDriverFacts facts = probe_cuda_driver();
  if (facts.error.has_value()) {
    EXPECT_EQ(facts.device_count, 0);
    EXPECT_TRUE(facts.gpus.empty());
  } else {
    ASSERT_TRUE(facts.library.has_value());
    EXPECT_EQ(facts.device_count, static_cast<int>(facts.gpus.size()));
    for (const GpuFacts& gpu : facts.gpus) {
      EXPECT_TRUE(gpu.name.has_value());
      EXPECT_TRUE(gpu.total_memory.has_value());
    }
  }
}

// Versions compare by their first two numbers; a GPU off the process's NUMA nodes is advised
// numactl, one that shares a node is not; an unknown topology says so and names no node.
TEST(MachineAdvice, ComparesVersionsAndPlacesGpusByNumaNode) {
  MachineFacts facts;
  facts.stowage_with_cuda = true;
  facts.torch = {true, "2.11.0", "13.0", true, std::nullopt, "2.11.0", true, true, std::nullopt};
  facts.total_memory = 1ULL << 35;
  facts.driver_version = "12.10";
  facts.runtime_version = "12.9.1";
  facts.gpus.push_back({3, "H200", false, true, "0000:3b:00.0", std::vector<std::int64_t>{1}, "8-15"});
  facts.process_numa_nodes = {0};
  facts.process_cpus = "0-7";
  std::vector<std::string> advice = machine_advice(facts);
  ASSERT_EQ(advice.size(), 1U) << advice.front();
  EXPECT_NE(advice[0].find("GPU 3 is nearest NUMA node 1 (CPUs 8-15), but this process runs on CPUs 0-7 (node 0)"),
            std::string::npos);
  facts.process_numa_nodes = {1, 0};
  facts.runtime_version = "13.0";
  advice = machine_advice(facts);
  ASSERT_EQ(advice.size(), 1U);
  EXPECT_EQ(advice[0].rfind("The driver supports CUDA up to 12.10 but the runtime is 13.0", 0), 0U);
  facts.runtime_version = "12.10";
  facts.numa_error = "hwloc: broken";
  advice = machine_advice(facts);
  ASSERT_EQ(advice.size(), 1U);
  EXPECT_EQ(advice[0].rfind("The NUMA topology is unknown (hwloc: broken)", 0), 0U);
}

// torch that cannot be imported is advised with the reason import torch gave: not installed, or
// a STOWAGE_ALLOC_CONF stowage refuses as torch loads.
TEST(MachineAdvice, TorchThatCannotBeImportedIsAdvisedWithWhy) {
  MachineFacts facts;
  facts.total_memory = 1ULL << 35;
  facts.torch.import_error = "STOWAGE_ALLOC_CONF='bogus:1': allocator config: unknown key 'bogus'";
  const std::vector<std::string> advice = machine_advice(facts);
  const auto said = std::find_if(advice.begin(), advice.end(), [](const std::string& line) {
    return line.rfind("torch cannot be imported (STOWAGE_ALLOC_CONF='bogus:1': allocator config: unknown key", 0) == 0;
  });
  EXPECT_NE(said, advice.end()) << advice.size();
}

}  // namespace
}  // namespace stowage
