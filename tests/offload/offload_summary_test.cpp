// offload_summary_lines: the engine's statistics as lines, none before anything was offloaded, and
// a missing key named.
#include "offload/offload_summary.hpp"

#include <gtest/gtest.h>

#include "base/errors.hpp"

namespace stowage::offload {
namespace {

std::map<std::string, std::int64_t> statistics() {
  return {{"offload.num_offloads", 3},
          {"offload.offloaded_bytes.current", 3 << 20},
          {"offload.offloaded_bytes.peak", 5 << 20},
          {"offload.pinned.reserved_bytes.current", 8 << 20},
          {"offload.pinned.reserved_bytes.peak", 16 << 20},
          {"offload.pinned.num_pinnings", 2},
          {"offload.pinned.pageable_bytes", 0},
          {"offload.bytes_offloaded", 10 << 20},
          {"offload.to_host.bytes_per_second", (std::int64_t{3} << 30) / 2},
          {"offload.bytes_reloaded", 7 << 20},
          {"offload.to_device.bytes_per_second", 0},
          {"offload.num_stalls", 4},
          {"offload.stall_ns", 12345678},
          {"offload.num_prefetched", 9},
          {"offload.num_syncs", 1}};
}

TEST(OffloadSummary, EachFigureInItsLineAndARateNotYetTimedAsADash) {
  std::map<std::string, std::int64_t> stats = statistics();
  EXPECT_EQ(offload_summary_lines(stats),
            (std::vector<std::string>{"Offloaded: 3.00 MiB now, 5.00 MiB at most",
                                      "Pinned host memory: 8.00 MiB (peak 16.00 MiB, 2 pinnings, pageable 0 B)",
                                      "Offloaded 10.00 MiB at 1.50 GiB/s, reloaded 7.00 MiB at -",
                                      "Stalls: 4, 12.3 ms; prefetched 9; syncs 1"}));
  stats["offload.stall_ns"] = 250000;  // rounded half to even, as Python's format rounds it
  EXPECT_EQ(offload_summary_lines(stats)[3], "Stalls: 4, 0.2 ms; prefetched 9; syncs 1");
}

TEST(OffloadSummary, NoLinesBeforeAnythingWasOffloaded) {
  EXPECT_TRUE(offload_summary_lines({}).empty());
  std::map<std::string, std::int64_t> stats = statistics();
  stats["offload.num_offloads"] = 0;
  EXPECT_TRUE(offload_summary_lines(stats).empty());
}

TEST(OffloadSummary, AMissingKeyOrANegativeByteCountIsNamed) {
  std::map<std::string, std::int64_t> stats = statistics();
  stats.erase("offload.num_syncs");
  try {
    offload_summary_lines(stats);
    FAIL() << "a missing key was not refused";
  } catch (const LogicError& error) {
    EXPECT_NE(std::string(error.what()).find("offload.num_syncs"), std::string::npos) << error.what();
  }
  stats = statistics();
  stats["offload.bytes_reloaded"] = -1;
  EXPECT_THROW(offload_summary_lines(stats), LogicError);
}

}  // namespace
}  // namespace stowage::offload
