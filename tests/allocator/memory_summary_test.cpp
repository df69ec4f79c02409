// memory_summary prints torch.cuda.memory_summary()'s table: units chosen by the row's largest
// figure, the title centred, extra lines boxed, and a missing statistic named.
#include "allocator/memory_summary.hpp"

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "allocator/stats.hpp"
#include "base/errors.hpp"

namespace stowage {
namespace {

std::map<std::string, std::int64_t> zero_stats() {
  std::map<std::string, std::int64_t> stats;
  for (const auto& [key, value] : memory_stats_entries(DeviceStats{})) {
    stats[key] = value;
  }
  return stats;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
  }
  return lines;
}

TEST(MemorySummary, EveryLineIsTheBoxWidthAndTheTitleIsCentred) {
  const auto lines = lines_of(memory_summary(zero_stats(), "a title", false, {}));
  ASSERT_EQ(lines.size(), 47U);  // 6 head lines, 9 metrics x 4, 2 oversize x 2, the foot
  for (const std::string& line : lines) {
    EXPECT_EQ(line.size(), 77U) << line;
    EXPECT_EQ(line.front(), '|');
    EXPECT_EQ(line.back(), '|');
  }
  EXPECT_EQ(lines[1], "|" + std::string(34, ' ') + "a title" + std::string(34, ' ') + "|");
}

TEST(MemorySummary, UnitsFollowTheRowsLargestFigure) {
  auto stats = zero_stats();
  stats["allocated_bytes.all.current"] = 3 << 20;          // 3 MiB: the row shows KiB
  stats["allocated_bytes.all.peak"] = 5LL << 30;           // 5 GiB: MiB
  stats["allocated_bytes.large_pool.current"] = 3 << 20;   // shown in the all row's unit
  stats["allocation.all.allocated"] = 2'000'000;           // counts: K
  const std::string text = memory_summary(stats, "t", false, {});
  EXPECT_NE(text.find("| Allocated memory      |   3072 KiB |   5120 MiB |      0 B   |      0 B   |"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("|       from large pool |   3072 KiB |"), std::string::npos) << text;
  EXPECT_NE(text.find("|    2000 K  |"), std::string::npos) << text;
}

TEST(MemorySummary, AbbreviatedLeavesThePoolsOutAndExtraLinesAreBoxed) {
  const auto lines = lines_of(memory_summary(zero_stats(), "t", true, {"Offloaded: 1 GiB"}));
  EXPECT_EQ(lines.size(), 47U - 18U + 2U);  // no pool rows; the extra line and its rule
  EXPECT_EQ(lines[lines.size() - 2], "| Offloaded: 1 GiB" + std::string(57, ' ') + " |");
}

TEST(MemorySummary, AnExtraLineWiderThanTheBoxIsWrappedAtSpaces) {
  const std::string wide = "Pinned host memory: 309.99 MiB (peak 311.98 MiB, 100 pinnings, pageable 0 B)";
  const std::string unbroken(150, 'x');
  const auto lines = lines_of(memory_summary(zero_stats(), "t", true, {wide, unbroken}));
  ASSERT_EQ(lines.size(), 47U - 18U + 1U + 2U + 3U);  // the two lines wrapped onto five, and the rule
  for (const std::string& line : lines) EXPECT_EQ(line.size(), 77U) << line;
  EXPECT_EQ(lines[lines.size() - 6], "| Pinned host memory: 309.99 MiB (peak 311.98 MiB, 100 pinnings, pageable 0 |");
  EXPECT_EQ(lines[lines.size() - 5], "|   B)" + std::string(69, ' ') + " |");
  EXPECT_EQ(lines[lines.size() - 4], "| " + std::string(73, 'x') + " |");
  EXPECT_EQ(lines[lines.size() - 3], "|   " + std::string(71, 'x') + " |");
  EXPECT_EQ(lines[lines.size() - 2], "|   " + std::string(6, 'x') + std::string(65, ' ') + " |");
}

TEST(MemorySummary, AMissingStatisticIsNamed) {
  auto stats = zero_stats();
  stats.erase("reserved_bytes.small_pool.freed");
  try {
    memory_summary(stats, "t", false, {});
    FAIL() << "no error";
  } catch (const LogicError& error) {
    EXPECT_NE(std::string(error.what()).find("reserved_bytes.small_pool.freed"), std::string::npos);
  }
}

TEST(MemorySummary, TheTitleNamesTheCudaDeviceOrCpuModesSimulatedOne) {
  EXPECT_EQ(memory_summary_title(-1, std::size_t{4} << 30), "stowage memory summary, simulated device of 4.00 GiB");
  EXPECT_EQ(memory_summary_title(1, std::size_t{80} << 30), "stowage memory summary, CUDA device 1 (80.00 GiB)");
}

}  // namespace
}  // namespace stowage
