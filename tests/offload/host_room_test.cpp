// What host memory the process may take: the smallest of MemAvailable, the cgroup's room (v2,
// else v1) and the caller's limit, each named; files that cannot be read set no limit.
#include "offload/host_room.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace stowage::offload {
namespace {

class HostRoomTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("stowage_host_room_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ / "cgroup" / "job");
    std::filesystem::create_directories(root_ / "cgroup" / "memory");
    sources_ = {(root_ / "meminfo").string(), (root_ / "self_cgroup").string(), (root_ / "cgroup").string()};
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void write(const std::filesystem::path& path, const std::string& text) { std::ofstream(root_ / path) << text; }

  std::filesystem::path root_;
  HostRoomSources sources_;
};

TEST_F(HostRoomTest, MemAvailableWhenItIsTheOnlyLimit) {
  write("meminfo", "MemTotal:       4000 kB\nMemAvailable:    1000 kB\n");
  const HostRoom room = host_room(std::nullopt, sources_);
  EXPECT_EQ(room.available_bytes, 1000 * 1024);
  EXPECT_EQ(room.limited_by, "available host memory (MemAvailable)");
}

TEST_F(HostRoomTest, TheCgroupsRoomAndTheCallersLimitWinWhenSmaller) {
  write("meminfo", "MemAvailable:    1000 kB\n");
  write("self_cgroup", "0::/job\n");
  write("cgroup/job/memory.max", "600000\n");
  write("cgroup/job/memory.current", "100000\n");
  HostRoom room = host_room(std::nullopt, sources_);
  EXPECT_EQ(room.available_bytes, 500000);
  EXPECT_EQ(room.limited_by, "the cgroup's memory limit");
  room = host_room(4096, sources_);
  EXPECT_EQ(room.available_bytes, 4096);
  EXPECT_EQ(room.limited_by, "host_memory_limit");
}

TEST_F(HostRoomTest, AnUnlimitedV2GroupFallsBackToV1AndNoFileMeansNoLimit) {
  write("self_cgroup", "0::/job\n");
  write("cgroup/job/memory.max", "max\n");
  write("cgroup/job/memory.current", "100\n");
  write("cgroup/memory/memory.limit_in_bytes", "3000\n");
  write("cgroup/memory/memory.usage_in_bytes", "1000\n");
  EXPECT_EQ(host_room(std::nullopt, sources_).available_bytes, 2000);
  std::filesystem::remove_all(root_ / "cgroup");
  std::filesystem::remove(root_ / "self_cgroup");
  const HostRoom room = host_room(std::nullopt, sources_);
  EXPECT_EQ(room.available_bytes, std::int64_t{1} << 62);
  EXPECT_EQ(room.limited_by, "nothing (no limit could be read)");
}

}  // namespace
}  // namespace stowage::offload
