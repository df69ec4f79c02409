#include "allocator/replay_table.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

ReplayTableRow resnet_row() {
  ReplayTableRow row;
  row.trace = "/traces/cpu_resnet50_b16_3steps.pickle.gz";
  row.events = 26730;
  row.peak_requested = 1550 * kMiB;
  row.peak_reserved = 1598 * kMiB;
  row.maps = 799;
  row.steps = 1;
  row.ns_per_call_p50 = 80;
  row.ns_per_call_p99 = 190.5;  // half to even, as Python: 190
  row.events_per_second = 12.46e6;
  return row;
}

TEST(ReplayTable, FormatsARowAsPythonFormatsItsNumbers) {
  const ReplayTable table = replay_table({resnet_row()});
  ASSERT_EQ(table.columns.size(), 14u);
  EXPECT_EQ(table.columns.front(), "trace");
  ASSERT_EQ(table.rows.size(), 1u);
  EXPECT_EQ(table.rows[0], (std::vector<std::string>{"cpu_resnet50_b16_3steps", "0", "26,730", "0", "1,550",
                                                     "1,598 (1.031x)", "-", "-", "799/0", "1", "-", "80/190", "12.5",
                                                     "no"}));
  EXPECT_TRUE(table.notes.empty());
}

TEST(ReplayTable, RoundsMibHalfToEvenAndShowsTheWarmStepsCalls) {
  ReplayTableRow row = resnet_row();
  row.peak_requested = 2 * kMiB + kMiB / 2;  // 2.5 MiB: "2"
  row.min_capacity = 3 * kMiB + kMiB / 2;    // 3.5 MiB: "4"
  row.steps_after_warmup = 3;
  row.device_calls_after_warmup = 1234;
  row.worst_step_ms = 0.25;  // "0.2", half to even
  row.events_per_second.reset();
  row.oom = true;
  const std::vector<std::string> cells = replay_table({row}).rows.at(0);
  EXPECT_EQ(cells[4], "2");
  EXPECT_EQ(cells[6], "4 (1.400x)");
  EXPECT_EQ(cells[10], "1,234 (0.2 ms)");
  EXPECT_EQ(cells[12], "-");
  EXPECT_EQ(cells[13], "yes");
  row.device_calls_after_warmup = 0;
  EXPECT_EQ(replay_table({row}).rows.at(0)[10], "0");
}

TEST(ReplayTable, StarsANativeFigureThatIsNotComparableAndSaysWhyOnce) {
  ReplayTableRow comparable = resnet_row(), reused = resnet_row();
  comparable.native_peak_reserved = 1600 * kMiB;
  comparable.native_comparable = true;
  reused.native_peak_reserved = 1600 * kMiB;
  const ReplayTable table = replay_table({comparable, reused, reused});
  EXPECT_EQ(table.rows[0][7], "1,600 (1.032x)");
  EXPECT_EQ(table.rows[1][7], "1,600 (1.032x) *");
  ASSERT_EQ(table.notes.size(), 1u);
  EXPECT_EQ(table.notes[0].rfind("* the trace's allocations reused memory", 0), 0u);
}

TEST(ReplayTable, NotesWhatLearnedPlacementDidUnderTheFileName) {
  ReplayTableRow row = resnet_row();
  row.layouts_made = 2;
  row.departures = 1;
  row.placed_allocations = 12345;
  EXPECT_EQ(replay_table({row}).notes.at(0),
            "cpu_resnet50_b16_3steps.pickle.gz: learned placement made 2 step layout(s), left 1, placed 12,345 "
            "request(s).");
  row.arena_bytes = 64 * kMiB;
  row.layout_live_bytes = 48 * kMiB;
  EXPECT_EQ(replay_table({row}).notes.at(0),
            "cpu_resnet50_b16_3steps.pickle.gz: learned placement made 2 step layout(s), left 1, placed 12,345 "
            "request(s); the layout in force packs 48 MiB live into 64 MiB.");
  EXPECT_TRUE(replay_table({resnet_row()}).notes.empty());
}

}  // namespace
}  // namespace stowage
