// fit's share search (Note [Choosing a share]): the tie rule, ranks agreeing, and the options
// weighed against a model whose peak grows with a micro-batch's rows: the largest fitting size
// found by bisection equals the one found by trying every count, each option solved once.
#include "planner/share_search.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <utility>

namespace stowage::planner {
namespace {

constexpr double kTie = 0.03;

TEST(ShareSearch, TheFastestWinsAndWithinTheTieTheMostRowsThenTheMostStates) {
  EXPECT_EQ(pick_choice({{{1.0, 8}, 100.0}, {{0.5, 8}, 99.0}, {{0.0, 8}, 90.0}}, kTie), (ShareChoice{0.0, 8}));
  EXPECT_EQ(pick_choice({{{1.0, 8}, 102.0}, {{0.5, 8}, 100.0}}, kTie), (ShareChoice{1.0, 8}));
  EXPECT_EQ(pick_choice({{{1.0, 4}, 100.0}, {{0.5, 8}, 102.0}, {{0.25, 8}, 101.0}}, kTie), (ShareChoice{0.5, 8}));
  EXPECT_EQ(pick_choice({}, kTie), std::nullopt);
}

TEST(ShareSearch, AStepThatFitsAsGivenIsTakenAsGiven) {
  const TimedChoices timed{{{1.0, 8}, 100.0}, {{0.0, 8}, 60.0}};
  EXPECT_EQ(pick_choice(timed, kTie), (ShareChoice{0.0, 8}));
  EXPECT_EQ(pick_choice(timed, kTie, ShareChoice{1.0, 8}), (ShareChoice{1.0, 8}));
  // Not among the feasible choices (it does not fit as given): the fastest.
  EXPECT_EQ(pick_choice({{{0.5, 8}, 100.0}, {{0.0, 8}, 60.0}}, kTie, ShareChoice{1.0, 8}), (ShareChoice{0.0, 8}));
}

TEST(ShareSearch, TheParametersGoToTheHostOnlyForAFasterStep) {  // within the tie they stay on the device
  EXPECT_EQ(pick_choice({{{1.0, 4, true}, 99.0}, {{0.5, 8, false}, 100.0}}, kTie), (ShareChoice{0.5, 8, false}));
  EXPECT_EQ(pick_choice({{{1.0, 8, true}, 90.0}, {{1.0, 8, false}, 100.0}}, kTie), (ShareChoice{1.0, 8, true}));
}

TEST(ShareSearch, RanksAgreeOnAChoiceEveryRankFitsTimedByTheSlowest) {
  const std::vector<TimedChoices> ranks{{{{0.5, 8}, 100.0}, {{0.25, 8}, 100.0}, {{0.0, 8}, 100.0}},
                                        {{{0.25, 8}, 100.0}, {{0.0, 8}, 100.0}}};
  EXPECT_EQ(agree_choice(ranks, kTie), (ShareChoice{0.25, 8}));
  // Slowest rank's time decides: (0.25, 8) is 20% slower on rank 1, so (0.0, 8) wins.
  const std::vector<TimedChoices> slow{{{{0.25, 8}, 100.0}, {{0.0, 8}, 100.0}}, {{{0.25, 8}, 120.0}, {{0.0, 8}, 100.0}}};
  EXPECT_EQ(agree_choice(slow, kTie), (ShareChoice{0.0, 8}));
  EXPECT_EQ(agree_choice({{{{1.0, 8}, 1.0}}, {{{0.5, 8}, 1.0}}}, kTie), std::nullopt);
}

// A step whose micro-batch of r rows fits when r <= fits_up_to[share] and keeps everything when
// r <= keeps_up_to.
struct Model {
  std::map<double, std::int64_t> fits_up_to;
  std::int64_t keeps_up_to = 0;
  std::set<std::pair<double, std::int64_t>> asked;
  int repeats = 0;

  EvaluateOption evaluate() {
    return [this](double fraction, std::int64_t rows, std::int64_t) {
      repeats += asked.insert({fraction, rows}).second ? 0 : 1;
      const bool fits = rows <= fits_up_to.at(fraction);
      return WeighedOption{fits, fits && rows <= keeps_up_to, static_cast<double>(rows)};
    };
  }
};

TEST(ShareSearch, ABatchThatFitsWholeIsWeighedWholeThenHalvedUntilItKeepsEverything) {
  Model model{{{1.0, 64}, {0.5, 64}}, 16, {}, 0};
  const auto listed = weigh_shares({1.0, 0.5}, {64, std::nullopt, 1, 3}, model.evaluate());
  const std::vector<ShareChoice> expected{{1.0, 64}, {1.0, 32}, {1.0, 16}, {0.5, 64}, {0.5, 32}, {0.5, 16}};
  EXPECT_EQ(listed, expected);
  EXPECT_EQ(model.repeats, 0);
}

TEST(ShareSearch, AShareWhereNothingFitsListsTheWholeBatchAlone) {
  Model model{{{1.0, 0}}, 0, {}, 0};
  EXPECT_EQ(weigh_shares({1.0}, {64, std::nullopt, 2, 3}, model.evaluate()), (std::vector<ShareChoice>{{1.0, 64}}));
  Model asked{{{1.0, 0}}, 0, {}, 0};
  EXPECT_EQ(weigh_shares({1.0}, {64, 24, 2, 3}, asked.evaluate()), (std::vector<ShareChoice>{{1.0, 24}}));
}

TEST(ShareSearch, BisectionFindsTheLargestFittingSizeOnRandomModels) {
  std::mt19937_64 random(41);
  for (int trial = 0; trial < 500; ++trial) {
    const std::int64_t rows = std::uniform_int_distribution<std::int64_t>(1, 200)(random);
    const std::int64_t smallest = std::uniform_int_distribution<std::int64_t>(1, 8)(random);
    Model model{{{1.0, std::uniform_int_distribution<std::int64_t>(0, 220)(random)}}, 0, {}, 0};
    model.keeps_up_to = std::uniform_int_distribution<std::int64_t>(0, 220)(random);
    const auto listed = weigh_shares({1.0}, {rows, std::nullopt, smallest, 3}, model.evaluate());
    std::optional<std::int64_t> largest;  // by trying every count of micro-batches
    for (std::int64_t count = 1; count <= rows / smallest || count == 1; ++count) {
      const std::int64_t size = (rows + count - 1) / count;
      if (size <= model.fits_up_to.at(1.0) && (count == 1 || rows / smallest >= 2)) {
        largest = size;
        break;
      }
    }
    SCOPED_TRACE(trial);
    EXPECT_EQ(model.repeats, 0);
    ASSERT_FALSE(listed.empty());
    if (!largest) {
      EXPECT_EQ(listed, (std::vector<ShareChoice>{{1.0, rows}}));
      continue;
    }
    const std::size_t first = *largest < rows ? 1 : 0;  // the whole batch, listed where it does not fit
    ASSERT_GT(listed.size(), first);
    EXPECT_EQ(listed[first].micro_rows, *largest);
    for (std::size_t i = first + 1; i < listed.size(); ++i) {
      EXPECT_EQ(listed[i].micro_rows, (listed[i - 1].micro_rows + 1) / 2);  // halvings
      EXPECT_GT(listed[i - 1].micro_rows, model.keeps_up_to);  // stopped at the first that keeps everything
    }
  }
}

}  // namespace
}  // namespace stowage::planner
