// fit's weighing (planner/fit_weighing) against figures worked out by hand, and its invariants
// over random memory figures: a feasible option's plan fits its budget, the host holds what it
// offloads, the optimizer's step fits, and shares keeping the same states are weighed once.
#include "planner/fit_weighing.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include <cstdint>
#include <random>
#include <set>

#include "tests/planner/mirrored_step.hpp"

namespace stowage::planner {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

// `n` forward ops each saving one offloadable (not recomputable) 1 MiB tensor used again in the
// mirrored backward op: the step adds n MiB at its turn unless the plan offloads.
LifetimeTrace offloadable_step(std::size_t n) {
  return mirrored_step(n, [] { return 1.0; }, 0, [] { return static_cast<std::uint64_t>(kMiB); });
}

// Two parameters of 1M elements, 4 bytes each, two moments: 8 MiB of states each.
FitInputs two_parameters(std::int64_t usable, std::int64_t host_available) {
  const CostModel cost{1e6, 2e6, 2};
  FitMemory memory{usable, 20 * kMiB, 2 * kMiB, 8 * kMiB, 8 * kMiB, 4 * kMiB, {kMiB, kMiB}, {8 * kMiB, 8 * kMiB}};
  return FitInputs{StepTraces(offloadable_step(8), cost),
                   memory,
                   FitHost{8, host_available, "MemAvailable", kMiB, 3},
                   UpdateRates{1e-5, 1e-6},
                   {{1.0, 2}, {0.5, 1}, {0.0, 0}},
                   ShareSearch{4, 4, 1, 3},
                   std::nullopt,
                   true,
                   0};
}

TEST(PlannerStepTraces, RegionsLeftOutOfRecomputeAreNeitherCheckpointedNorRecomputedAtAnyRows) {
  LifetimeTrace trace = offloadable_step(4);
  trace.regions = {TraceRegion{"a", 0, true, {}, {}}, TraceRegion{"b", 0, true, {}, {}}};
  for (std::size_t t = 0; t < trace.tensors.size(); ++t) {
    trace.tensors[t].recomputable = true;
    trace.tensors[t].region = static_cast<std::int32_t>(t % 2);
  }
  const StepTraces whole(trace, CostModel{1e6, 2e6, 2});
  const LifetimeTrace left_out = whole.without_recompute({1}).at(8);
  EXPECT_TRUE(left_out.regions[0].checkpointable);
  EXPECT_FALSE(left_out.regions[1].checkpointable);
  for (const SavedTensor& tensor : left_out.tensors) EXPECT_EQ(tensor.recomputable, tensor.region == 0);
  const LifetimeTrace unchanged = whole.at(8);  // the original is a value, untouched
  EXPECT_TRUE(unchanged.regions[1].checkpointable);
  for (const SavedTensor& tensor : unchanged.tensors) EXPECT_TRUE(tensor.recomputable);
}

TEST(PlannerFitWeighing, WorksOutEachShareAsByHand) {
  const std::vector<FitOption> options = weigh_fit(two_parameters(60 * kMiB, std::int64_t{1} << 40));
  ASSERT_EQ(options.size(), 3u);
  const FitOption& all = options[0];
  EXPECT_EQ(all.activation_budget, 60 * kMiB - 20 * kMiB - 16 * kMiB);
  EXPECT_EQ(all.optimizer_peak, 20 * kMiB + 8 * kMiB + 16 * kMiB + 8 * kMiB);  // foreach: a copy of every parameter
  EXPECT_EQ(all.host_bytes, 0);
  EXPECT_DOUBLE_EQ(all.update_ms, 2.0 * kMiB * 1e-6);
  EXPECT_TRUE(all.feasible() && all.keeps_everything());
  const FitOption& half = options[1];
  EXPECT_EQ(half.activation_budget, 60 * kMiB - 20 * kMiB - 8 * kMiB);
  EXPECT_EQ(half.optimizer_peak, 20 * kMiB + 8 * kMiB + 8 * kMiB + 2 * kMiB);  // the largest parameter's, halved
  EXPECT_EQ(half.host_bytes, 8 * kMiB + 3 * 2 * kMiB);  // 8 B a parameter of states; 3 slots of 1 MiB buckets
  // The kept half on the device, then the offloaded half streamed (Note [Weighing fit's options]): its
  // host update (10.5 ms) outlasts its 4 MiB of parameters and 4 MiB of gradients out at 1e6 B/ms
  // (8.4 ms) and its parameters back at 2e6 B/ms (2.1 ms); one bucket's (1 MiB) copies are exposed.
  const double streamed = std::max({2.0 * kMiB * 0.5 * 1e-5, 2 * 4.0 * kMiB / 1e6, 4.0 * kMiB / 2e6});
  EXPECT_DOUBLE_EQ(half.update_ms, 2.0 * kMiB * 0.5 * 1e-6 + streamed + 2 * 1.0 * kMiB / 1e6 + 1.0 * kMiB / 2e6);
  EXPECT_DOUBLE_EQ(streamed, 2.0 * kMiB * 0.5 * 1e-5);
  EXPECT_DOUBLE_EQ(half.step_ms(), half.prediction.step_ms + half.update_ms);
}

TEST(PlannerFitWeighing, TheStagingRingHoldsAtMostItsSlotsOfTheLargestBucket) {
  const FitHost host{8, 0, "MemAvailable", 4 * kMiB, 3};
  EXPECT_EQ(host.staging_bytes(0), 0);
  EXPECT_EQ(host.staging_bytes(kMiB), 2 * kMiB);           // one bucket of 1 MiB: one slot
  EXPECT_EQ(host.staging_bytes(6 * kMiB), 2 * 2 * 4 * kMiB);  // two buckets: two slots
  EXPECT_EQ(host.staging_bytes(100 * kMiB), 3 * 2 * 4 * kMiB);
  EXPECT_EQ(host.staging_bytes(1000 * kMiB), host.staging_bytes(100 * kMiB));
  EXPECT_EQ((FitHost{8, 0, "MemAvailable", 0, 0}.staging_bytes(kMiB)), 0);  // no ring (kept buffers)
}

TEST(PlannerFitWeighing, SaysWhyAnOptionIsOut) {
  const std::vector<FitOption> tight = weigh_fit(two_parameters(36 * kMiB, 20 * kMiB));
  EXPECT_EQ(tight[0].reason, "the states alone fill the device");
  EXPECT_FALSE(tight[0].solved);
  EXPECT_EQ(tight[2].reason, "the host cannot hold the offloaded states: 22.00 MiB needed, 20.00 MiB available "
                             "(MemAvailable)");  // 2 M parameters at 8 B, and the staging ring's 3 x 2 MiB
  const std::vector<FitOption> small = weigh_fit(two_parameters(36 * kMiB + kMiB / 2, std::int64_t{1} << 40));
  EXPECT_EQ(small[0].reason.rfind("no plan fits: the lowest step peak found is ", 0), 0u) << small[0].reason;
  EXPECT_TRUE(small[0].solved);
}

TEST(PlannerFitWeighing, FeasibleOptionsFitEverywhereAndSameStatesAreWeighedOnce) {
  std::mt19937 random(11);
  std::uniform_int_distribution<std::int64_t> usable(30 * kMiB, 80 * kMiB);
  std::uniform_int_distribution<std::int64_t> host(0, 64 * kMiB);
  std::uniform_int_distribution<std::int64_t> reserve(0, 4 * kMiB);
  for (int round = 0; round < 80; ++round) {
    FitInputs inputs = two_parameters(usable(random), host(random));
    inputs.reserve = reserve(random);
    inputs.search = ShareSearch{8, std::nullopt, 1, 3};
    inputs.shares.insert(inputs.shares.end() - 1, {0.25, 0});  // keeps what 0.0 keeps: weighed as one of them
    const std::vector<FitOption> options = weigh_fit(inputs);
    std::set<double> fractions;
    for (const FitOption& option : options) {
      fractions.insert(option.fraction);
      EXPECT_EQ(option.micro_batches, (8 + option.micro_rows - 1) / option.micro_rows);
      if (!option.feasible()) continue;
      EXPECT_LE(option.prediction.peak_bytes, static_cast<std::uint64_t>(option.activation_budget));
      EXPECT_LE(option.host_bytes, inputs.host.available);
      EXPECT_LE(option.optimizer_peak, inputs.memory.usable);
      EXPECT_EQ(option.activation_budget, inputs.memory.usable - 20 * kMiB - option.device_state_bytes -
                                              inputs.reserve - (option.micro_batches > 1 ? 2 * kMiB : 0));
    }
    EXPECT_FALSE(fractions.contains(0.0) && fractions.contains(0.25)) << "round " << round;
  }
}

}  // namespace
}  // namespace stowage::planner
