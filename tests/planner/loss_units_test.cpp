// What a loss is a mean over, judged on the example batch's losses (planner/loss_units.hpp):
// losses made by a known mean are told from the other counts, alike counts kept together, two
// counts the losses cannot tell apart refused, spans checked where the whole batch was not.
#include "planner/loss_units.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

namespace stowage::planner {
namespace {

using Counts = std::vector<double>;

// A cut of one batch into micro-batches whose losses are means over `by` of per-unit values
// `mean_of` each, and whose whole loss is the mean over every unit.
CutLosses cut_by(const Counts& by, const Counts& mean_of) {
  CutLosses cut;
  double total = 0.0, sum = 0.0;
  for (std::size_t i = 0; i < by.size(); ++i) {
    cut.losses.push_back(mean_of[i]);
    total += by[i];
    sum += by[i] * mean_of[i];
  }
  cut.spans.push_back({0, by.size(), sum / total});
  return cut;
}

TEST(LossUnits, TheCountTheLossIsAMeanOverIsTheOneThatHolds) {
  const Counts tokens{3, 5, 8, 1}, rows{2, 2, 2, 2}, means{1.5, 0.75, 2.25, 3.0};
  const auto judged = judge_loss_units({cut_by(tokens, means)}, {{"rows", {rows}}, {"tokens", {tokens}}}, 1e-6, "");
  EXPECT_EQ(judged.alike, (std::vector<std::size_t>{1}));
  EXPECT_EQ(judged.why_not, "");
}

TEST(LossUnits, CountsGivingAlikeSharesAreKeptTogetherTheFirstNamingThem) {
  const Counts rows{2, 2, 2}, masks{6, 6, 6}, means{1.0, 2.0, 4.0};
  const auto judged = judge_loss_units({cut_by(rows, means)}, {{"rows", {rows}}, {"masks", {masks}}}, 1e-6, "");
  EXPECT_EQ(judged.alike, (std::vector<std::size_t>{0, 1}));
}

TEST(LossUnits, CountsTheLossesCannotTellApartAreRefusedNamingThem) {
  const Counts rows{2, 2}, tokens{3, 5}, means{1.0, 1.0};  // equal losses: every weighting holds
  const auto judged = judge_loss_units({cut_by(rows, means)}, {{"rows", {rows}}, {"tokens", {tokens}}}, 1e-6, "");
  EXPECT_TRUE(judged.alike.empty());
  const std::string said = "the example batch cannot tell whether the loss is a mean over rows or over tokens";
  EXPECT_EQ(judged.why_not.rfind(said, 0), 0U);
}

TEST(LossUnits, WhereNoneHoldsTheFirstMissIsSaidWithTheRandomDraws) {
  CutLosses cut{{1.0, 2.0}, {{0, 2, 7.0}}};
  const auto judged = judge_loss_units({cut}, {{"rows", {{2, 2}}}, {"tokens", {{0, 0}}}}, 1e-6, "aten.rand");
  EXPECT_TRUE(judged.alike.empty());
  EXPECT_EQ(judged.why_not,
            "the loss of the whole batch (7) is not its micro-batches' weighted by rows (1.5), nor by any other count "
            "its tensors offer; the step draws random numbers (aten.rand) that a cut draws differently; pass "
            "loss_units= to say what it is a mean over");
  const auto none = judge_loss_units({cut}, {{"tokens", {{0, 0}}}}, 1e-6, "");
  EXPECT_EQ(none.why_not, "the example batch holds no tokens; pass loss_units= to say what it is a mean over");
}

TEST(LossUnits, SpansAreCheckedEachAgainstItsOwnMicroBatches) {
  CutLosses cut{{1.0, 3.0, 2.0, 4.0}, {{0, 2, 2.0}, {2, 4, 3.0}}};
  EXPECT_EQ(judge_loss_units({cut}, {{"rows", {{1, 1, 1, 1}}}}, 1e-9, "").alike, (std::vector<std::size_t>{0}));
  cut.spans[1].loss = 3.5;
  EXPECT_EQ(judge_loss_units({cut}, {{"rows", {{1, 1, 1, 1}}}}, 1e-9, "").why_not.rfind("the loss of a span (3.5)", 0),
            0U);
}

TEST(LossUnits, RandomCutsOfAMeanOverTokensHoldByTokensAlone) {
  std::mt19937 random(7);
  std::uniform_int_distribution<int> count(1, 9);
  std::uniform_real_distribution<double> value(0.1, 5.0);
  for (int trial = 0; trial < 200; ++trial) {
    Counts tokens, rows, means;
    for (int i = 0; i < 2 + trial % 6; ++i) {
      tokens.push_back(count(random));
      rows.push_back(2);
      means.push_back(value(random));
    }
    const auto judged = judge_loss_units({cut_by(tokens, means)}, {{"rows", {rows}}, {"tokens", {tokens}}}, 1e-9, "");
    ASSERT_FALSE(judged.alike.empty()) << trial << ": " << judged.why_not;
    ASSERT_EQ(judged.alike.back(), 1U) << trial;  // tokens always holds; rows only where the shares agree
  }
}

TEST(LossUnits, TheToleranceIsTheMeasuredNoiseWithinTheDtypesRounding) {
  EXPECT_DOUBLE_EQ(loss_tolerance({"float32"}, "float32", false, 1e-7), 16 * 1e-7);
  EXPECT_DOUBLE_EQ(loss_tolerance({"float32"}, "float32", false, 1e-9), 1e-6);  // at least the loss's rounding
  EXPECT_DOUBLE_EQ(loss_tolerance({"float32"}, "float32", false, 1e-3), 1e-5);  // at most the forwards'
  EXPECT_DOUBLE_EQ(loss_tolerance({"float32"}, "float32", false, std::nullopt), 1e-5);  // nothing measured
  EXPECT_DOUBLE_EQ(loss_tolerance({"float32", "bfloat16"}, "float32", false, 1.0), 1.6e-2);
  EXPECT_DOUBLE_EQ(loss_tolerance({"float32"}, "float32", true, 1.0), 2e-3);  // tf32 keeps float16's mantissa
  EXPECT_DOUBLE_EQ(loss_tolerance({}, "float64", true, std::nullopt), 2e-3);  // nothing made: float32
  EXPECT_DOUBLE_EQ(loss_tolerance({"float64"}, "float64", false, 0.0), 1e-13);
  EXPECT_DOUBLE_EQ(loss_tolerance({"float8_e4m3fn"}, "float8_e4m3fn", false, 0.0), 1e-6);  // unknown: float32's
}

TEST(LossUnits, ABatchIsWeightedByItsUnitsUnlessAnAlikeCountWeighsItOtherwise) {
  const auto shares = unit_shares({"tokens", {3, 1, 0}}, {{"rows", {6, 2, 0}}});
  EXPECT_EQ(shares.shares, (std::vector<double>{0.75, 0.25, 0.0}));
  EXPECT_EQ(shares.why_not, "");
  EXPECT_EQ(unit_shares({"tokens", {0, 0}}, {}).why_not,
            "stowage.fit: the batch holds no tokens to average the loss over");
  const auto refused = unit_shares({"tokens", {3, 1}}, {{"rows", {2, 2}}});
  EXPECT_TRUE(refused.shares.empty());
  EXPECT_EQ(refused.why_not.rfind("stowage.fit: this batch's micro-batches weigh 0.750/0.250 by tokens and "
                                  "0.500/0.500 by rows, and the example batch could not tell", 0),
            0U);
}

}  // namespace
}  // namespace stowage::planner
