// How far ahead the blocks' parameters come in (planner/parameter_prefetch): the passes read off a
// trace, the exposed copy time worked out by hand where the copies bound the pass, where the
// compute does and where one long unit lets deeper copies hide, and over random passes its
// invariants: the exposed time never grows with the depth, the window is what the offloaded
// parameters' schedule holds, and the depth chosen is the fewest within the tie under the room.
#include "planner/parameter_prefetch.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "offload/parameter_schedule.hpp"

namespace stowage::planner {
namespace {

// `compute[i]` ms for unit i, run in index order, nothing between.
std::vector<PassUnit> pass_of(const std::vector<double>& compute) {
  std::vector<PassUnit> pass;
  for (std::size_t u = 0; u < compute.size(); ++u) pass.push_back(PassUnit{u, 0, compute[u]});
  return pass;
}

UnitPasses both(const std::vector<double>& compute) {
  UnitPasses passes{pass_of(compute), pass_of(compute)};
  std::reverse(passes.backward.begin(), passes.backward.end());
  return passes;
}

TEST(PlannerParameterPrefetch, CopyBoundPassesGainNothingPastOneUnitAhead) {
  // Four units of 10 bytes at 1 byte/ms (10 ms a copy), 2 ms of compute each. At depth 0 every
  // unit waits its whole copy (40 ms); ahead, the stream is never idle: the first waits 10 ms, each
  // other its copy less the 2 ms the one before ran (8 ms): 34 ms, at any depth past 0.
  const std::vector<PassUnit> pass = pass_of({2, 2, 2, 2});
  const std::vector<std::int64_t> bytes(4, 10);
  EXPECT_DOUBLE_EQ(exposed_copy_ms(pass, bytes, 1.0, 0), 40.0);
  for (std::size_t depth = 1; depth < 6; ++depth) EXPECT_DOUBLE_EQ(exposed_copy_ms(pass, bytes, 1.0, depth), 34.0);
  const ParameterPrefetch chosen = choose_parameter_prefetch(both({2, 2, 2, 2}), bytes, 1.0, 1000);
  EXPECT_EQ(chosen.depth, 1u);
  EXPECT_EQ(chosen.exposed_ms, (std::vector<double>{80, 68, 68, 68}));
  EXPECT_EQ(chosen.window_bytes, (std::vector<std::int64_t>{10, 20, 30, 40}));
}

TEST(PlannerParameterPrefetch, ComputeBoundPassesWaitForTheFirstCopyAloneOneUnitAhead) {
  // 20 ms of compute a unit, 10 ms copies: one ahead, only the first unit waits (10 ms).
  const std::vector<std::int64_t> bytes(4, 10);
  EXPECT_DOUBLE_EQ(exposed_copy_ms(pass_of({20, 20, 20, 20}), bytes, 1.0, 0), 40.0);
  EXPECT_DOUBLE_EQ(exposed_copy_ms(pass_of({20, 20, 20, 20}), bytes, 1.0, 1), 10.0);
  EXPECT_EQ(choose_parameter_prefetch(both({20, 20, 20, 20}), bytes, 1.0, 1000).depth, 1u);
  // Copies a thousand times faster: waiting for each is within the tie of 1% of 160 ms of compute.
  EXPECT_EQ(choose_parameter_prefetch(both({20, 20, 20, 20}), bytes, 1000.0, 1000).depth, 0u);
}

TEST(PlannerParameterPrefetch, OneLongUnitHidesTheCopiesOfTheUnitsAfterItWhenTheyComeInDeeper) {
  // Forward: unit 0 runs 30 ms, the others 1 ms, copies 10 ms. One ahead: units 2 and 3 wait 9 ms
  // each besides the first copy (28 ms); two ahead, unit 3 alone waits 8 (18 ms); three, none (10).
  const std::vector<PassUnit> pass = pass_of({30, 1, 1, 1});
  const std::vector<std::int64_t> bytes(4, 10);
  EXPECT_DOUBLE_EQ(exposed_copy_ms(pass, bytes, 1.0, 1), 28.0);
  EXPECT_DOUBLE_EQ(exposed_copy_ms(pass, bytes, 1.0, 2), 18.0);
  EXPECT_DOUBLE_EQ(exposed_copy_ms(pass, bytes, 1.0, 3), 10.0);
  const UnitPasses forward_only{pass, {}};
  EXPECT_EQ(choose_parameter_prefetch(forward_only, bytes, 1.0, 40).depth, 3u);
  EXPECT_EQ(choose_parameter_prefetch(forward_only, bytes, 1.0, 39).depth, 2u);  // the room holds three units
  EXPECT_EQ(choose_parameter_prefetch(forward_only, bytes, 1.0, 9).depth, 0u);   // nor one: the least
}

TEST(PlannerParameterPrefetch, ReadsEachUnitsComputeInBothPassesOffTheTrace) {
  // Forward: an embedding op (1 ms), blocks.0 (2 + 3 ms), blocks.1 (4 ms), the head (5 ms).
  // Backward: the head's (6 ms), blocks.1's tensor used at op 6, a residual's op (7 ms), blocks.0's
  // tensors used at ops 8 and 9. blocks.2 ran nothing.
  LifetimeTrace trace;
  const std::vector<std::pair<std::string, double>> forward{{"embed", 1}, {"blocks.0.attn", 2}, {"blocks.0", 3},
                                                            {"blocks.1.mlp", 4}, {"head", 5}};
  for (const auto& [module, ms] : forward) trace.ops.push_back({"f", module, Phase::kForward, ms, 0});
  for (const double ms : {6.0, 1.5, 7.0, 2.5, 3.5, 0.5}) trace.ops.push_back({"b", "", Phase::kBackward, ms, 0});
  const std::vector<std::pair<std::string, std::pair<std::size_t, std::size_t>>> saved{
      {"blocks.0.attn", {8, 8}}, {"blocks.0", {9, 9}}, {"blocks.1.mlp", {6, 6}}, {"head", {5, 5}}};
  for (const auto& [module, uses] : saved) {
    SavedTensor tensor;
    tensor.module = module;
    tensor.first_backward_use = uses.first;
    tensor.last_backward_use = uses.second;
    trace.tensors.push_back(tensor);
  }
  const UnitPasses passes = unit_passes(trace, {"blocks.0", "blocks.1", "blocks.2"});
  ASSERT_EQ(passes.forward.size(), 3u);
  EXPECT_EQ(passes.forward[0].unit, 0u);
  EXPECT_DOUBLE_EQ(passes.forward[0].before_ms, 1.0);
  EXPECT_DOUBLE_EQ(passes.forward[0].compute_ms, 5.0);
  EXPECT_EQ(passes.forward[1].unit, 1u);
  EXPECT_DOUBLE_EQ(passes.forward[1].compute_ms, 4.0);
  EXPECT_EQ(passes.forward[2].unit, 2u);  // ran nothing: last, with no compute
  EXPECT_DOUBLE_EQ(passes.forward[2].compute_ms, 0.0);
  ASSERT_EQ(passes.backward.size(), 3u);
  EXPECT_EQ(passes.backward[0].unit, 2u);
  EXPECT_EQ(passes.backward[1].unit, 1u);
  EXPECT_DOUBLE_EQ(passes.backward[1].before_ms, 6.0);  // the head's backward
  EXPECT_DOUBLE_EQ(passes.backward[1].compute_ms, 1.5);
  EXPECT_EQ(passes.backward[2].unit, 0u);
  EXPECT_DOUBLE_EQ(passes.backward[2].before_ms, 7.0);
  EXPECT_DOUBLE_EQ(passes.backward[2].compute_ms, 2.5 + 3.5);
  EXPECT_DOUBLE_EQ(passes.compute_ms(), 1 + 5 + 4 + 6 + 1.5 + 7 + 6);
}

TEST(PlannerParameterPrefetch, RandomPassesKeepTheInvariants) {
  std::mt19937_64 random(20261129);
  for (int round = 0; round < 300; ++round) {
    const std::size_t units = 1 + random() % 9;
    std::vector<std::int64_t> bytes;
    std::vector<double> compute;
    for (std::size_t u = 0; u < units; ++u) {
      bytes.push_back(1 + static_cast<std::int64_t>(random() % 1000));
      compute.push_back(static_cast<double>(random() % 300) / 10);
    }
    UnitPasses passes = both(compute);
    for (PassUnit& unit : passes.backward) unit.before_ms = static_cast<double>(random() % 50) / 10;
    const double rate = 1.0 + static_cast<double>(random() % 200);
    const std::int64_t room = static_cast<std::int64_t>(random() % 3000);
    const ParameterPrefetch chosen = choose_parameter_prefetch(passes, bytes, rate, room);
    ASSERT_EQ(chosen.exposed_ms.size(), units);
    for (std::size_t depth = 0; depth < units; ++depth) {
      if (depth > 0) {
        EXPECT_LE(chosen.exposed_ms[depth], chosen.exposed_ms[depth - 1] + 1e-9) << "round " << round;
        EXPECT_GE(chosen.window_bytes[depth], chosen.window_bytes[depth - 1]);
      }
      // The window is what the schedule holds over a forward and a backward at that depth.
      std::vector<std::vector<std::size_t>> unit_parameters;
      for (std::size_t u = 0; u < units; ++u) unit_parameters.push_back({u});
      offload::ParameterSchedule schedule(std::vector<std::size_t>(bytes.begin(), bytes.end()), unit_parameters, depth);
      for (std::size_t u = 0; u < units; ++u) {
        schedule.hold(u, offload::SchedulePass::kForward);
        schedule.release(u);
      }
      for (std::size_t u = units; u-- > 0;) {
        schedule.hold(u, offload::SchedulePass::kBackward);
        schedule.release(u);
      }
      EXPECT_EQ(static_cast<std::int64_t>(schedule.peak_resident_bytes()), chosen.window_bytes[depth]);
    }
    // The fewest units ahead within the tie of the least among those whose window fits.
    if (chosen.window_bytes[0] > room) {
      EXPECT_EQ(chosen.depth, 0u);
      continue;
    }
    EXPECT_LE(chosen.window_bytes[chosen.depth], room);
    double least = chosen.exposed_ms[0];
    for (std::size_t depth = 0; depth < units && chosen.window_bytes[depth] <= room; ++depth) {
      least = std::min(least, chosen.exposed_ms[depth]);
    }
    const double tie = kDepthTie * passes.compute_ms();
    EXPECT_LE(chosen.exposed_ms[chosen.depth], least + tie);
    for (std::size_t depth = 0; depth < chosen.depth; ++depth) EXPECT_GT(chosen.exposed_ms[depth], least + tie);
  }
}

}  // namespace
}  // namespace stowage::planner
