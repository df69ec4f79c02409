// snapshot/diff_report: stowage diff's tables and line, cells as the terminal shows them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "snapshot/diff_report.hpp"

namespace stowage::snapshot {
namespace {

using Row = std::vector<std::string>;

SnapshotsDiff two_steps() {
  SnapshotsDiff diff;
  diff.before = {3 << 20, 4 << 20, 1 << 20, 2, 0.25, std::nullopt};
  diff.after = {2 << 20, 4 << 20, 2 << 20, 1, 0.125, Wide{5} << 20};
  diff.sites.grew = {{"train.py:12 forward", 0, 1 << 20, 1 << 20}};
  diff.segments.only_before = 1;
  diff.segments.only_before_bytes = 2 << 20;
  diff.segments.changed = {{0x7f00, 2 << 20, 2 << 20, 1 << 20, 512 << 10, -(512 << 10)},
                           {0x9f00, 2 << 20, 4 << 20, 0, 0, 0}};
  diff.segments.changed_count = 1234;
  return diff;
}

TEST(DiffReport, TotalsSignTheirChangesAndShowWhatOneSnapshotLacksAsADash) {
  const TextTable totals = diff_report(two_steps()).totals;
  EXPECT_EQ(totals.columns, (Row{"", "before", "after", "change"}));
  EXPECT_EQ(totals.left, (Row{""}));
  ASSERT_EQ(totals.rows.size(), 6u);
  EXPECT_EQ(totals.rows[0], (Row{"allocated", "3.00 MiB", "2.00 MiB", "-1.00 MiB"}));
  EXPECT_EQ(totals.rows[1], (Row{"reserved", "4.00 MiB", "4.00 MiB", "0 B"}));
  EXPECT_EQ(totals.rows[2], (Row{"largest free block", "1.00 MiB", "2.00 MiB", "+1.00 MiB"}));
  EXPECT_EQ(totals.rows[3], (Row{"live peak of the trace", "-", "5.00 MiB", "-"}));
  EXPECT_EQ(totals.rows[4], (Row{"segments", "2", "1", "-1"}));
  EXPECT_EQ(totals.rows[5], (Row{"fragmentation", "25.0%", "12.5%", "-12.5 points"}));
  SnapshotsDiff untraced = two_steps();
  untraced.after.trace_peak.reset();
  EXPECT_EQ(diff_report(untraced).totals.rows.size(), 5u);  // no peak either side: no row
}

TEST(DiffReport, SitesOnlyWhereOneChangedAndSegmentsChangedInPlace) {
  const DiffReport report = diff_report(two_steps());
  ASSERT_EQ(report.sites.size(), 1u);
  EXPECT_EQ(report.sites[0].title, "grew, by site");
  EXPECT_EQ(report.sites[0].rows.at(0), (Row{"+1.00 MiB", "0 B", "1.00 MiB", "train.py:12 forward"}));
  EXPECT_EQ(report.segments, "segments: 1 given back (2.00 MiB), 0 new (0 B), 1,234 changed in place");
  ASSERT_TRUE(report.changed_segments);
  EXPECT_TRUE(report.changed_segments->left.empty());
  EXPECT_EQ(report.changed_segments->rows.at(0), (Row{"0x7f00", "2.00 MiB", "1.00 MiB", "512.00 KiB", "-512.00 KiB"}));
  EXPECT_EQ(report.changed_segments->rows.at(1).at(1), "2.00 MiB -> 4.00 MiB");
  SnapshotsDiff still = two_steps();
  still.sites.grew.clear();
  still.segments.changed.clear();
  EXPECT_TRUE(diff_report(still).sites.empty());
  EXPECT_FALSE(diff_report(still).changed_segments);
}

TEST(DiffReport, ACountPast64BitsIsWrittenInFullNotWrapped) {
  SnapshotsDiff diff = two_steps();
  diff.segments.changed[0].address = Wide{1} << 64;
  diff.segments.only_after_bytes = Wide{1} << 64;
  const DiffReport report = diff_report(diff);
  EXPECT_EQ(report.changed_segments->rows.at(0).at(0), "0x10000000000000000");
  EXPECT_NE(report.segments.find("18446744073709551616 B"), std::string::npos);
}

}  // namespace
}  // namespace stowage::snapshot
