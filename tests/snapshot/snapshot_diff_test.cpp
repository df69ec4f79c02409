// snapshot/snapshot_diff: sites that grew and shrank, segments given back, new and changed in
// place (an expandable one matched by its start), the order of each list and its cut at `top`;
// and two snapshots compared in one call (totals, live bytes from active_allocated blocks).
#include <gtest/gtest.h>

#include <vector>

#include "snapshot/snapshot_diff.hpp"

namespace stowage::snapshot {
namespace {

TEST(SnapshotDiff, SitesThatGrewAndShrankMostFirstTiesInTheOrderGiven) {
  const std::vector<SiteBytes> before = {{"a", 100}, {"b", 50}, {"c", 30}, {"same", 7}};
  const std::vector<SiteBytes> after = {{"c", 60}, {"a", 40}, {"new", 30}, {"same", 7}, {"also new", 30}};
  const SitesDiff found = diff_sites(before, after, 10);
  ASSERT_EQ(found.grew.size(), 3u);
  EXPECT_EQ(found.grew[0].site, "c");  // +30, first given (in A)
  EXPECT_EQ(found.grew[1].site, "new");
  EXPECT_EQ(found.grew[2].site, "also new");
  EXPECT_EQ(found.grew[0].before, 30);
  EXPECT_EQ(found.grew[0].after, 60);
  ASSERT_EQ(found.shrank.size(), 2u);
  EXPECT_EQ(found.shrank[0].site, "a");  // -60
  EXPECT_EQ(found.shrank[0].change, -60);
  EXPECT_EQ(found.shrank[1].site, "b");  // -50: gone
  EXPECT_EQ(found.shrank[1].after, 0);
  EXPECT_EQ(diff_sites(before, after, 1).grew.size(), 1u);
}

TEST(SnapshotDiff, SegmentsAreMatchedByAddressAndSizeAndExpandableOnesByTheirStart) {
  const std::vector<SegmentFacts> before = {
      {0x1000, 2 << 20, false, 1 << 20},  // the same in both: live bytes changed
      {0x5000, 4 << 20, false, 0},        // given back (B has another size there)
      {0x9000, 8 << 20, true, 1 << 20},   // expandable: grew in place
      {0xd000, 2 << 20, false, 512},      // unchanged
  };
  const std::vector<SegmentFacts> after = {
      {0x1000, 2 << 20, false, 1536 << 10},
      {0x5000, 6 << 20, false, 0},
      {0x9000, 16 << 20, true, 1 << 20},
      {0xd000, 2 << 20, false, 512},
  };
  const SegmentsDiff found = diff_segments(before, after, 10);
  EXPECT_EQ(found.only_before, 1u);
  EXPECT_EQ(found.only_before_bytes, 4 << 20);
  EXPECT_EQ(found.only_after, 1u);
  EXPECT_EQ(found.only_after_bytes, 6 << 20);
  ASSERT_EQ(found.changed_count, 2u);
  EXPECT_EQ(found.changed[0].address, 0x1000);  // live +512 KiB first, then the one that only grew
  EXPECT_EQ(found.changed[0].live_change, 512 << 10);
  EXPECT_EQ(found.changed[1].address, 0x9000);
  EXPECT_EQ(found.changed[1].size_before, 8 << 20);
  EXPECT_EQ(found.changed[1].size_after, 16 << 20);
  EXPECT_EQ(diff_segments(before, after, 1).changed.size(), 1u);
  EXPECT_EQ(diff_segments(before, after, 1).changed_count, 2u);
}

TEST(SnapshotDiff, TwoSegmentsSharingAKeyCountOnceTheLaterStandingForIt) {
  const std::vector<SegmentFacts> before = {{0x1000, 1024, false, 0}, {0x1000, 1024, false, 512}};
  const std::vector<SegmentFacts> after = {{0x1000, 1024, false, 512}};
  const SegmentsDiff found = diff_segments(before, after, 10);
  EXPECT_EQ(found.only_before, 0u);
  EXPECT_EQ(found.only_after, 0u);
  EXPECT_EQ(found.changed_count, 0u);
  EXPECT_EQ(diff_segments(after, {}, 10).only_before_bytes, 1024);
}

TEST(SnapshotDiff, SnapshotsAreComparedByTotalsSitesAndSegmentsInOneCall) {
  const TraceInput empty{};
  const std::vector<SegmentInput> before = {{0x1000, 4096, false, {{1024, 1000, "active_allocated", "a.py:1"},
                                                                  {3072, 3072, "inactive", std::nullopt}}}};
  const std::vector<SegmentInput> after = {{0x1000, 4096, false, {{4096, 4096, "active_allocated", "a.py:1"}}},
                                           {0x9000, 2048, false, {{2048, 2048, "inactive", std::nullopt}}}};
  const SnapshotsDiff found = diff_snapshots({empty, before}, {empty, after}, 10);
  EXPECT_TRUE(found.before.reserved == 4096 && found.after.reserved == 6144);
  EXPECT_EQ(found.before.segments, 1);
  EXPECT_EQ(found.after.segments, 2);
  EXPECT_FALSE(found.before.trace_peak.has_value());  // no trace events: no peak to compare
  EXPECT_EQ(found.segments.only_after, 1u);
  ASSERT_EQ(found.segments.changed.size(), 1u);
  EXPECT_TRUE(found.segments.changed[0].live_before == 1024 && found.segments.changed[0].live_after == 4096);
  ASSERT_EQ(found.sites.grew.size(), 1u);
  EXPECT_TRUE(found.sites.grew[0].change == 3072);
}

}  // namespace
}  // namespace stowage::snapshot
