// How fit cuts a batch (planner/micro_cut.hpp): near-equal micro-batches, sizes differing by at
// most one, a larger batch as more (none over the plan's rows), a smaller one as up to as many
// (none under kMinRows where more pieces than the plan's rows need), checked on every batch size
// up to three times the example's for every cut fit makes of it.
#include "planner/micro_cut.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/errors.hpp"
#include "planner/batch_layout.hpp"

namespace stowage::planner {
namespace {

using Bounds = std::vector<std::int64_t>;

TEST(MicroCut, ACountThatDoesNotDivideTheRowsRunsAsAskedInNearEqualCuts) {
  EXPECT_EQ(MicroCut::of(13, 2), (MicroCut{13, 2, 7}));
  EXPECT_EQ(MicroCut::of(16, 5).bounds(16), (Bounds{0, 3, 6, 9, 12, 16}));
  EXPECT_EQ(MicroCut::of(16, 5).bounds(30).size(), 9U);  // a larger batch: 8 of at most 4 rows
  EXPECT_EQ(MicroCut::of(16, 5).bounds(6), (Bounds{0, 2, 4, 6}));  // a smaller one: none under 2 rows
  EXPECT_EQ(MicroCut::of(16, 1).bounds(16), (Bounds{0, 16}));
  EXPECT_EQ(MicroCut::of(16, 4).bounds(0), (Bounds{0, 0}));  // an empty batch: one empty piece
}

TEST(MicroCut, TheFinestCutIsRowGroupsOfTwoAtMostThirtyTwoOfThem) {
  EXPECT_EQ(MicroCut::finest(3), (MicroCut{3, 1, 3}));
  EXPECT_EQ(MicroCut::finest(16), (MicroCut{16, 8, 2}));
  EXPECT_EQ(MicroCut::finest(100), (MicroCut{100, 32, 4}));
}

TEST(MicroCut, EveryBatchIsCutIntoContiguousPiecesWithinTheirBounds) {
  for (std::int64_t rows = 1; rows <= 40; ++rows) {
    for (std::int64_t count = 1; count <= std::max(rows / kMinRows, std::int64_t{1}); ++count) {  // the cuts fit makes
      const MicroCut cut = MicroCut::of(rows, count);
      EXPECT_EQ(static_cast<std::int64_t>(cut.bounds(rows).size()) - 1, count) << rows << " / " << count;
      for (std::int64_t batch = 1; batch <= 3 * rows; ++batch) {
        const Bounds bounds = cut.bounds(batch);
        ASSERT_EQ(bounds.front(), 0);
        ASSERT_EQ(bounds.back(), batch);
        std::int64_t smallest = batch, largest = 0;
        for (std::size_t i = 1; i < bounds.size(); ++i) {
          smallest = std::min(smallest, bounds[i] - bounds[i - 1]);
          largest = std::max(largest, bounds[i] - bounds[i - 1]);
        }
        ASSERT_LE(largest - smallest, 1) << rows << " / " << count << " at " << batch;
        ASSERT_LE(largest, cut.most) << rows << " / " << count << " at " << batch;
        if (cut.count_at(batch) > (batch + cut.most - 1) / cut.most) {  // more pieces than `most` needs
          ASSERT_GE(smallest, kMinRows) << rows << " / " << count << " at " << batch;
        }
      }
    }
  }
}

TEST(MicroCut, ACutOfNoRowsIsRefused) {
  EXPECT_THROW(MicroCut::of(0, 1), LogicError);
  EXPECT_THROW(MicroCut::of(4, 0), LogicError);
  EXPECT_THROW((MicroCut{4, 2, 0}).bounds(4), LogicError);
}

TEST(MicroCut, AStepIsRecordedNearestTheExampleFirstAtSizesItCanVary) {
  using Grid = RecordingGrid;
  const auto grids = recording_grids(8, 512);
  ASSERT_EQ(grids.size(), 3U);
  EXPECT_EQ(grids[0], (Grid{{"batch", {2, 3}}, {"seq", {256, 320, 384}}}));
  EXPECT_EQ(grids[1], (Grid{{"batch", {2, 3}}, {"seq", {128, 192, 256}}}));
  EXPECT_EQ(grids[2], (Grid{{"batch", {2, 3}}, {"seq", {64, 128, 192}}}));
  EXPECT_EQ(recording_grids(2, 24).front(), (Grid{{"seq", {12, 15, 18}}}));  // 2 rows: the rows stay
  EXPECT_EQ(recording_grids(16, 0), (std::vector<Grid>{{{"batch", {2, 3}}}}));  // no sequence: rows alone
  EXPECT_EQ(recording_grids(16, 23), (std::vector<Grid>{{{"batch", {2, 3}}}}));
  EXPECT_TRUE(recording_grids(2, 23).empty());  // too small to record smaller
  for (std::int64_t seq = 24; seq <= 600; ++seq) {
    for (const Grid& grid : recording_grids(4, seq)) {
      const auto& points = grid.back().second;
      ASSERT_EQ(points.size(), 3U);
      ASSERT_TRUE(points[0] < points[1] && points[1] < points[2] && points[2] < seq) << seq;
    }
  }
}

TEST(MicroCut, TheCutAskedIsRunAsAskedOrRefusedNeverAnother) {
  EXPECT_EQ(MicroCut::asked(8, std::nullopt), std::nullopt);               // "auto": fit chooses
  EXPECT_EQ(MicroCut::asked(3, std::nullopt), (MicroCut{3, 1, 3}));        // too few rows to cut: whole
  EXPECT_EQ(MicroCut::asked(13, 2), (MicroCut{13, 2, 7}));
  EXPECT_EQ(MicroCut::asked(1, 1), (MicroCut{1, 1, 1}));
  EXPECT_THROW(MicroCut::asked(0, std::nullopt), std::invalid_argument);  // no rows
  EXPECT_THROW(MicroCut::asked(8, 0), std::invalid_argument);
  EXPECT_THROW(MicroCut::asked(7, 4), std::invalid_argument);             // a micro-batch of 1 row
  EXPECT_NO_THROW(MicroCut::asked(8, 4));
}

TEST(BatchLayout, RowsAreTheFirstDimensionEveryTensorSharesOrHasAsOne) {
  const BatchLayout layout = batch_layout({{"batch['input_ids']", {4, 10}, true},
                                           {"batch['position_ids']", {1, 10}, true},
                                           {"batch['pixel_values']", {4, 3, 8}, false},
                                           {"batch['scale']", {}, false}});
  EXPECT_EQ(layout.rows, 4);
  EXPECT_EQ(layout.seq, 10);
  EXPECT_EQ(layout.per_row, (std::vector<std::string>{"batch['input_ids']", "batch['pixel_values']"}));
  EXPECT_EQ(batch_layout({{"batch", {1, 5}, true}}).rows, 1);        // one row, shared or not
  EXPECT_EQ(batch_layout({{"batch", {6, 3072}, false}}).seq, std::nullopt);  // a float's width is no sequence
  EXPECT_EQ(batch_layout({{"batch[0]", {6, 3}, false}, {"batch[1]", {6, 7}, true}}).seq, 7);
}

TEST(BatchLayout, TensorsThatDisagreeOnTheRowsOrNoneWithRowsAreRefusedNamingThem) {
  try {
    batch_layout({{"batch[0]", {4, 2}, false}, {"batch[1]", {5}, true}});
    FAIL() << "rows that disagree were taken";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("batch[0] has 4, batch[1] has 5"), std::string::npos) << error.what();
  }
  EXPECT_THROW(batch_layout({{"batch", {}, true}}), std::invalid_argument);
  EXPECT_THROW(batch_layout({}), std::invalid_argument);
}

}  // namespace
}  // namespace stowage::planner
