// MemoryBudget: a reading's memory bound is the floor and a share a byte of pickle, at most a
// ceiling whatever the file's size, and its refusal says the budget and what to do instead.
#include "snapshot/memory_budget.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "snapshot/refusal.hpp"

namespace stowage::snapshot {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

TEST(MemoryBudget, IsTheFloorAndTheShareUpToTheCeiling) {
  EXPECT_EQ(MemoryBudget(10 * kMiB, {12, kMemoryCeiling, ""}).budget(), kMemoryFloor + 120 * kMiB);
  // 1.5 GB: its share alone would be 18 GB (at 3 bytes a byte, 4.5 GB): the ceiling holds it
  EXPECT_EQ(MemoryBudget(1'500'000'000, {12, kMemoryCeiling, ""}).budget(), kMemoryCeiling);
  EXPECT_EQ(MemoryBudget(1'500'000'000, {3, kMemoryCeiling, ""}).budget(), kMemoryCeiling);
  EXPECT_EQ(MemoryBudget(1'500'000'000, {12, 64 * kMiB, ""}).budget(), 64 * kMiB);  // below the floor too
}

TEST(MemoryBudget, ASizeNearTwoToTheSixtyFourDoesNotWrapToASmallBudget) {
  for (const std::uint64_t size : {std::numeric_limits<std::uint64_t>::max(), std::uint64_t{1} << 62,
                                   (std::numeric_limits<std::uint64_t>::max() / 12) + 1}) {
    EXPECT_EQ(MemoryBudget(size, {12, kMemoryCeiling, ""}).budget(), kMemoryCeiling) << size;
  }
}

TEST(MemoryBudget, ARefusalNamesTheBudgetTheCeilingAndTheRemedy) {
  if (!resident_bytes()) GTEST_SKIP() << "resident memory cannot be read here";
  const MemoryBudget budget(1, {12, 32 * kMiB, "do this instead"});  // growth counted from now
  EXPECT_NO_THROW(budget.check(4096));
  std::vector<char> grown(48 * kMiB, 1);  // written: resident
  try {
    budget.check(8192);
    FAIL() << "not refused";
  } catch (const Refused& refused) {
    EXPECT_EQ(refused.message(),
              "reading it grew memory by more than 32 MiB by byte 8,192 (its budget: 96 MiB and 12 bytes a byte "
              "of pickle, at most 32 MiB): refused; do this instead");
  }
  EXPECT_EQ(grown[grown.size() / 2], 1);
}

TEST(MemoryBudget, TheColumnsRemedyNamesTheCeilingInWholeGibAndWhereToSetIt) {
  const std::string small = columns_remedy(1000, "stowage inspect a.pickle");
  EXPECT_NE(small.find("up to 12 bytes a byte"), std::string::npos) << small;
  EXPECT_NE(small.find("raise the ceiling: STOWAGE_SNAPSHOT_MEMORY=2GiB stowage inspect a.pickle; or record"),
            std::string::npos)
      << small;
  // 96 MiB and 12 bytes a byte of 1 GiB: 12.09 GiB, rounded up
  EXPECT_NE(columns_remedy(std::uint64_t{1} << 30, "").find(
                "STOWAGE_SNAPSHOT_MEMORY=13GiB in the environment of the program that reads it; or"),
            std::string::npos);
  EXPECT_NE(columns_remedy(std::numeric_limits<std::uint64_t>::max(), "").find("=206158430209GiB"), std::string::npos)
      << "no wrap past 64 bits";
}

}  // namespace
}  // namespace stowage::snapshot
