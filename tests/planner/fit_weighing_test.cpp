// fit's weighing (planner/fit_weighing) against figures worked out by hand, and its invariants
// over random memory figures: a feasible option's plan fits its budget, the host holds what it
// offloads, the optimizer's step fits, and shares keeping the same states are weighed once; with
// the blocks' parameters on the host, the device and host bytes they move and the copies' time.
#include "planner/fit_weighing.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/errors.hpp"
#include "planner/parameter_prefetch.hpp"
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
                   0,
                   FitBlocks{},
                   ParameterPlacement::kDevice};
}

// offloadable_step(n) run by n blocks: block i ("blocks.i") runs forward op i and saves tensor i,
// used again by backward op 2n - 1 - i.
LifetimeTrace blocks_step(std::size_t n) {
  LifetimeTrace trace = offloadable_step(n);
  for (std::size_t i = 0; i < n; ++i) {
    trace.ops[i].module = trace.tensors[i].module = "blocks." + std::to_string(i);
  }
  return trace;
}

UnitGradients block_gradients(std::size_t n, std::int64_t bytes) {
  UnitGradients units;
  for (std::size_t i = 0; i < n; ++i) units.emplace_back("blocks." + std::to_string(i), bytes);
  return units;
}

// Eight blocks of one parameter each, 1M fp32 elements (4 MiB; 8 MiB of states), and 2 MiB in use
// besides; torch's optimizer steps one parameter at a time (no foreach temporary). Each block runs
// 1 ms in forward and 1 ms in backward; its copy in takes 4 MiB / 2e6 B/ms, about 2.1 ms.
FitInputs eight_blocks(std::int64_t usable, std::int64_t host_available, ParameterPlacement placement,
                       LifetimeTrace trace = blocks_step(8)) {
  const CostModel cost{1e6, 2e6, 2};
  const std::vector<std::int64_t> numels(8, kMiB);
  const std::vector<std::int64_t> states(8, 8 * kMiB);
  FitMemory memory{usable, 34 * kMiB, 8 * kMiB, 32 * kMiB, 32 * kMiB, 4 * kMiB, numels, states};
  const FitBlocks blocks{8,        32 * kMiB, 32 * kMiB, 64 * kMiB, 8 * kMiB, 4 * kMiB, 4 * kMiB,
                         std::vector<std::int64_t>(8, 4 * kMiB), block_gradients(8, 4 * kMiB), false};
  return FitInputs{StepTraces(std::move(trace), cost),
                   memory,
                   FitHost{8, host_available, "MemAvailable", 4 * kMiB, 3},
                   UpdateRates{1e-5, 1e-6},
                   {{1.0, 8}, {0.0, 0}},
                   ShareSearch{4, 4, 1, 3},
                   std::nullopt,
                   false,
                   0,
                   blocks,
                   placement};
}

const FitOption* first_feasible(const std::vector<FitOption>& options) {
  const auto found = std::find_if(options.begin(), options.end(), [](const FitOption& o) { return o.feasible(); });
  return found == options.end() ? nullptr : &*found;
}
// (a pointer into a temporary vector would dangle: weigh first, then look)
const FitOption* first_feasible(const std::vector<FitOption>&&) = delete;

TEST(PlannerFitWeighing, ParametersAndGradientsFillingTheDeviceLeaveOnlyTheHostOption) {
  // 40 MiB: the parameters (32 MiB) and their gradients (32 MiB) alone outgrow it at the optimizer's
  // step whatever share of the states stays; with the blocks' parameters on the host the device
  // holds 2 MiB between steps and a window of two blocks' parameters and one's gradients (12 MiB):
  // the copies (2.1 ms) outlast the blocks' compute (1 ms), so one block ahead keeps the stream busy.
  const std::vector<FitOption> device_only = weigh_fit(eight_blocks(40 * kMiB, std::int64_t{1} << 40,
                                                                    ParameterPlacement::kDevice));
  EXPECT_EQ(first_feasible(device_only), nullptr);
  for (const FitOption& option : device_only) EXPECT_FALSE(option.parameters_on_host);
  const std::vector<FitOption> either = weigh_fit(eight_blocks(40 * kMiB, std::int64_t{1} << 40,
                                                               ParameterPlacement::kEither));
  const FitOption* feasible = first_feasible(either);
  ASSERT_NE(feasible, nullptr);
  EXPECT_TRUE(feasible->parameters_on_host);
  for (const FitOption& option : either) EXPECT_EQ(option.feasible(), option.parameters_on_host) << option.reason;
  EXPECT_EQ(feasible->fraction, 1.0);  // the factory's optimizer, updating the parameters where they live
  EXPECT_EQ(feasible->device_bytes, 2 * kMiB);
  EXPECT_EQ(feasible->window_bytes, 2 * 4 * kMiB + 4 * kMiB);
  EXPECT_EQ(feasible->activation_budget, 40 * kMiB - 2 * kMiB - 12 * kMiB);
  EXPECT_EQ(feasible->device_state_bytes, 0);
  EXPECT_EQ(feasible->host_bytes, 32 * kMiB + 32 * kMiB + 64 * kMiB);  // parameters, gradients, states
  EXPECT_EQ(feasible->optimizer_peak, 2 * kMiB + 4 * kMiB);  // the largest parameter's temporary
  EXPECT_DOUBLE_EQ(feasible->update_ms, 8.0 * kMiB * 1e-5);  // every parameter trains in a block
  // One block ahead, each pass waits for the first block's copy whole and for each other's less the
  // 1 ms the block before it ran; the 32 MiB of gradients out at 1e6 B/ms are not overlapped.
  EXPECT_EQ(feasible->parameter_prefetch, 1u);
  const double unit_ms = 4.0 * kMiB / 2e6;
  EXPECT_NEAR(feasible->parameter_copy_ms, 2 * (unit_ms + 7 * (unit_ms - 1)) + 32.0 * kMiB / 1e6, 1e-9);
  EXPECT_DOUBLE_EQ(feasible->step_ms(), feasible->prediction.step_ms + feasible->parameter_copy_ms +
                                            feasible->update_ms);
  // fit's default weighs the host only where nothing fits on the device: here, as "auto" does.
  const std::vector<FitOption> unless = weigh_fit(eight_blocks(40 * kMiB, std::int64_t{1} << 40,
                                                               ParameterPlacement::kDeviceUnlessNoneFits));
  ASSERT_EQ(unless.size(), either.size());
  for (std::size_t i = 0; i < unless.size(); ++i) {
    EXPECT_EQ(unless[i].parameters_on_host, either[i].parameters_on_host);
    EXPECT_EQ(unless[i].reason, either[i].reason);
  }
}

TEST(PlannerFitWeighing, StatesTheDeviceCountsStayOnItsSideWithTheParametersOnTheHost) {
  FitInputs inputs = eight_blocks(400 * kMiB, std::int64_t{1} << 40, ParameterPlacement::kHost);
  inputs.blocks.states_counted_on_device = true;  // CPU mode: host tensors are the device's memory
  const std::vector<FitOption> options = weigh_fit(inputs);
  ASSERT_EQ(options.size(), 1u);
  const FitOption& counted = options.front();
  EXPECT_EQ(counted.device_state_bytes, 64 * kMiB);
  EXPECT_EQ(counted.device_bytes, 2 * kMiB + 64 * kMiB);
  EXPECT_EQ(counted.activation_budget, 400 * kMiB - 2 * kMiB - 64 * kMiB - 12 * kMiB);
  EXPECT_EQ(counted.host_bytes, 32 * kMiB + 32 * kMiB);  // the plan offloads nothing: room to keep
}

// The offloaded twin updates the blocks' parameters on the host: torch's multi-tensor step runs over
// the device's parameters alone, so its temporary leaves the blocks' gradients out (where the device
// counts host tensors, CPU mode with the factory's optimizer, it does not).
TEST(PlannerFitWeighing, WithTheParametersOnTheHostTheForeachTemporaryIsTheDevicesParametersAlone) {
  FitInputs inputs = eight_blocks(400 * kMiB, std::int64_t{1} << 40, ParameterPlacement::kEither);
  inputs.foreach = true;
  inputs.memory.foreach_temporary = 36 * kMiB;  // the blocks' 32 MiB and 4 MiB of parameters outside them
  std::vector<FitOption> options = weigh_fit(inputs);
  const auto on_host = std::find_if(options.begin(), options.end(), [](const FitOption& o) {
    return o.parameters_on_host;
  });
  const auto on_device = std::find_if(options.begin(), options.end(), [](const FitOption& o) {
    return !o.parameters_on_host && o.fraction == 1.0;
  });
  ASSERT_NE(on_host, options.end());
  ASSERT_NE(on_device, options.end());
  EXPECT_EQ(on_host->optimizer_peak, 2 * kMiB + 4 * kMiB);
  EXPECT_EQ(on_device->optimizer_peak, 34 * kMiB + 32 * kMiB + 64 * kMiB + 36 * kMiB);
  inputs.blocks.states_counted_on_device = true;
  options = weigh_fit(inputs);
  const auto counted = std::find_if(options.begin(), options.end(), [](const FitOption& o) {
    return o.parameters_on_host;
  });
  ASSERT_NE(counted, options.end());
  EXPECT_EQ(counted->optimizer_peak, 2 * kMiB + 64 * kMiB + 36 * kMiB);
}

TEST(PlannerFitWeighing, TheHostOptionTheHostCannotHoldIsRefusedNamingTheHostFigure) {
  const std::vector<FitOption> options = weigh_fit(eight_blocks(40 * kMiB, 100 * kMiB, ParameterPlacement::kHost));
  ASSERT_FALSE(options.empty());
  for (const FitOption& option : options) {
    EXPECT_TRUE(option.parameters_on_host);
    EXPECT_EQ(option.reason, "the host cannot hold the offloaded parameters, gradients and states: 128.00 MiB "
                             "needed, 100.00 MiB available (MemAvailable)");
  }
}

TEST(PlannerFitWeighing, TheParametersStayOnTheDeviceWhereTheyFitAsFast) {
  // Room for everything on the device: the host option only adds copies, so it loses.
  const std::vector<FitOption> options = weigh_fit(eight_blocks(400 * kMiB, std::int64_t{1} << 40,
                                                                ParameterPlacement::kEither));
  TimedChoices timed;
  for (const FitOption& option : options) {
    if (option.feasible()) timed.push_back({{option.fraction, option.micro_rows, option.parameters_on_host},
                                            option.step_ms()});
  }
  const std::optional<ShareChoice> chosen = pick_choice(timed, 0.03);
  ASSERT_TRUE(chosen.has_value());
  EXPECT_FALSE(chosen->parameters_on_host);
  EXPECT_TRUE(std::any_of(options.begin(), options.end(),
                          [](const FitOption& o) { return o.parameters_on_host && o.feasible(); }));
  // fit's default does not weigh the host at all where the device holds an option.
  const std::vector<FitOption> unless = weigh_fit(eight_blocks(400 * kMiB, std::int64_t{1} << 40,
                                                               ParameterPlacement::kDeviceUnlessNoneFits));
  EXPECT_FALSE(unless.empty());
  for (const FitOption& option : unless) EXPECT_FALSE(option.parameters_on_host);
}

TEST(PlannerFitWeighing, EveryPlacementsFeasibleOptionFitsTheDeviceAndTheHost) {
  std::mt19937 random(5);
  std::uniform_int_distribution<std::int64_t> usable(20 * kMiB, 140 * kMiB);
  std::uniform_int_distribution<std::int64_t> host(0, 256 * kMiB);
  std::uniform_int_distribution<std::int64_t> reserve(0, 4 * kMiB);
  std::uniform_int_distribution<int> placement(0, 3);
  for (int round = 0; round < 60; ++round) {
    const auto where = static_cast<ParameterPlacement>(placement(random));
    FitInputs inputs = eight_blocks(usable(random), host(random), where);
    inputs.reserve = reserve(random);
    inputs.search = ShareSearch{8, std::nullopt, 1, 3};
    const std::vector<FitOption> options = weigh_fit(inputs);
    const bool device_fits = std::any_of(options.begin(), options.end(),
                                         [](const FitOption& o) { return !o.parameters_on_host && o.feasible(); });
    for (const FitOption& option : options) {
      if (where == ParameterPlacement::kDeviceUnlessNoneFits && device_fits) {
        EXPECT_FALSE(option.parameters_on_host);
      }
      if (where == ParameterPlacement::kDevice) {
        EXPECT_FALSE(option.parameters_on_host);
      } else if (where == ParameterPlacement::kHost) {
        EXPECT_TRUE(option.parameters_on_host);
      }
      if (!option.feasible()) continue;
      const std::int64_t gradients = option.parameters_on_host ? 0 : 32 * kMiB;
      EXPECT_LE(option.prediction.peak_bytes, static_cast<std::uint64_t>(option.activation_budget));
      EXPECT_LE(option.host_bytes, inputs.host.available);
      EXPECT_LE(option.optimizer_peak, inputs.memory.usable);
      EXPECT_EQ(option.device_bytes + option.window_bytes + option.activation_budget + inputs.reserve +
                    (option.micro_batches > 1 ? gradients : 0),
                inputs.memory.usable)
          << "round " << round;
      EXPECT_EQ(option.window_bytes, option.parameters_on_host ? 12 * kMiB : 0);
      EXPECT_EQ(option.parameter_copy_ms > 0, option.parameters_on_host);
    }
  }
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

TEST(PlannerStepTraces, ACalibratedStepScalesEveryOpAndRecomputeAndTheWeighedStep) {
  // Note [Calibrated compute]: the recorder's ops summed 1.6x the plain step's time; scaled by 1/1.6
  // every op and recompute time shrinks alike, and a plan that keeps everything is predicted at it.
  LifetimeTrace trace = offloadable_step(4);
  for (SavedTensor& tensor : trace.tensors) tensor.recompute_ms = 2.0;
  const StepTraces recorded(trace, CostModel{1e6, 2e6, 2});
  const StepTraces calibrated = recorded.with_compute_scale(1 / 1.6);
  EXPECT_EQ(calibrated.compute_scale(), 1 / 1.6);
  EXPECT_DOUBLE_EQ(calibrated.at(8).compute_ms(), recorded.at(8).compute_ms() / 1.6);
  for (const SavedTensor& tensor : calibrated.at(8).tensors) EXPECT_DOUBLE_EQ(tensor.recompute_ms, 2.0 / 1.6);
  EXPECT_DOUBLE_EQ(recorded.at(8).compute_ms(), trace.compute_ms());  // the original is a value, untouched
  FitInputs in = two_parameters(std::int64_t{1} << 40, std::int64_t{1} << 40);
  const double whole_ms = weigh_fit(in)[0].prediction.step_ms;
  in.traces = in.traces.with_compute_scale(0.5);
  EXPECT_DOUBLE_EQ(weigh_fit(in)[0].prediction.step_ms, whole_ms / 2);
  EXPECT_THROW(recorded.with_compute_scale(0), LogicError);
  EXPECT_THROW(recorded.with_compute_scale(std::nan("")), LogicError);
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

TEST(PlannerFitWeighing, AShareIsUpdatedAsItKeepsWholeParametersNotAsItsFraction) {
  // Parameters of 3M and 1M elements: the share 0.5 keeps the first whole (kept_on_device), so the
  // device updates 3M of them and the host 1M, not 2M each.
  FitInputs in = two_parameters(std::int64_t{1} << 40, std::int64_t{1} << 40);
  in.memory = FitMemory{std::int64_t{1} << 40, 20 * kMiB, 4 * kMiB, 16 * kMiB, 16 * kMiB, 12 * kMiB,
                        {3 * kMiB, kMiB}, {24 * kMiB, 8 * kMiB}};
  in.shares = {{1.0, 2}, {0.5, 1}};
  in.rates = UpdateRates{1e-5, 1e-6, 0.0, 0.0};
  const std::vector<FitOption> options = weigh_fit(in);
  ASSERT_EQ(options.size(), 2u);
  const FitOption& half = options[1];
  ASSERT_EQ(half.fraction, 0.5);
  // The host's 1M (10.5 ms) outlasts 4 MiB of parameters and gradients out at 1e6 B/ms (8.4 ms) and
  // 4 MiB back at 2e6 B/ms; one 1 MiB bucket's copies are exposed at the ends.
  const double streamed = std::max({1.0 * kMiB * 1e-5, 2 * 4.0 * kMiB / 1e6, 4.0 * kMiB / 2e6});
  EXPECT_DOUBLE_EQ(half.update_ms, 3.0 * kMiB * 1e-6 + streamed + 2 * 1.0 * kMiB / 1e6 + 1.0 * kMiB / 2e6);
}

TEST(PlannerFitWeighing, EachTensorAddsItsSidesTimeATensor) {
  // Note [Update rates]: 0.5 ms a tensor on the device, 0.25 ms on the host; the device steps both
  // tensors where it keeps every state, one where the share keeps one, the host the other.
  FitInputs in = two_parameters(60 * kMiB, std::int64_t{1} << 40);
  in.rates = UpdateRates{1e-5, 1e-6, 0.25, 0.5};
  const std::vector<FitOption> options = weigh_fit(in);
  ASSERT_EQ(options.size(), 3u);
  EXPECT_DOUBLE_EQ(options[0].update_ms, 2.0 * kMiB * 1e-6 + 2 * 0.5);
  const double streamed = std::max({1.0 * kMiB * 1e-5 + 0.25, 2 * 4.0 * kMiB / 1e6, 4.0 * kMiB / 2e6});
  EXPECT_DOUBLE_EQ(options[1].update_ms, 1.0 * kMiB * 1e-6 + 0.5 + streamed + 2 * 1.0 * kMiB / 1e6 + 1.0 * kMiB / 2e6);
  // With the blocks' parameters on the host: the eight blocks' eight tensors at the host's rates.
  FitInputs blocks = eight_blocks(std::int64_t{1} << 40, std::int64_t{1} << 40, ParameterPlacement::kHost);
  blocks.blocks.trained_tensors = 8;
  blocks.rates = UpdateRates{1e-5, 1e-6, 0.25, 0.5};
  const std::vector<FitOption> weighed = weigh_fit(blocks);  // (the option points into it)
  const FitOption* host = first_feasible(weighed);
  ASSERT_NE(host, nullptr);
  EXPECT_DOUBLE_EQ(host->update_ms, 8.0 * kMiB * 1e-5 + 8 * 0.25);
}

TEST(PlannerFitWeighing, AMeasuredStreamedStepTakesThePlaceOfTheModelledOne) {
  // The offloaded share's step() timed whole at 3e-5 ms an element and 0.75 ms a tensor: the
  // offloaded parameter (1M elements) costs that, whatever the copies' model would say.
  FitInputs in = two_parameters(60 * kMiB, std::int64_t{1} << 40);
  in.rates = UpdateRates{1e-5, 1e-6, 0.25, 0.5, 3e-5, 0.75};
  const std::vector<FitOption> options = weigh_fit(in);
  ASSERT_EQ(options.size(), 3u);
  EXPECT_DOUBLE_EQ(options[0].update_ms, 2.0 * kMiB * 1e-6 + 2 * 0.5);  // nothing streamed
  EXPECT_DOUBLE_EQ(options[1].update_ms, 1.0 * kMiB * 1e-6 + 0.5 + 1.0 * kMiB * 3e-5 + 0.75);
  EXPECT_DOUBLE_EQ(options[2].update_ms, 2.0 * kMiB * 3e-5 + 2 * 0.75);
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

namespace stowage::planner {
namespace {

TEST(PlannerFitWeighing, TheHostOptionBringsTheBlocksInAsFarAheadAsALongBlockHides) {
  // Block 0 runs 60 ms in forward: deeper, the other blocks' copies (2.1 ms each) come in under it.
  LifetimeTrace trace = blocks_step(8);
  trace.ops[0].duration_ms = 60;
  const FitInputs inputs = eight_blocks(400 * kMiB, std::int64_t{1} << 40, ParameterPlacement::kHost, trace);
  const std::vector<FitOption> options = weigh_fit(inputs);
  const FitOption* feasible = first_feasible(options);
  ASSERT_NE(feasible, nullptr);
  std::vector<std::string> paths;
  for (const auto& [path, bytes] : inputs.blocks.unit_gradients) paths.push_back(path);
  const ParameterPrefetch expected = choose_parameter_prefetch(unit_passes(trace, paths), inputs.blocks.unit_bytes, 2e6,
                                                               400 * kMiB);
  EXPECT_GT(feasible->parameter_prefetch, 1u);
  EXPECT_EQ(feasible->parameter_prefetch, expected.depth);
  EXPECT_LT(expected.exposed_ms[expected.depth], expected.exposed_ms[1]);
  EXPECT_EQ(feasible->window_bytes, static_cast<std::int64_t>(feasible->parameter_prefetch + 1) * 4 * kMiB + 4 * kMiB);
  EXPECT_NEAR(feasible->parameter_copy_ms, expected.exposed_ms[expected.depth] + 32.0 * kMiB / 1e6, 1e-9);
}

TEST(PlannerFitWeighing, AWindowThatLeavesNoPlanRoomIsNarrowedToTheFirstDepthWhereOneFits) {
  // As above, but the 8 MiB of saved tensors cannot move, and the device has 24 MiB: 2 MiB in use,
  // 4 MiB of a block's gradients, 18 MiB for the parameters' window and the activations. The depth
  // chosen under that room (two or three blocks ahead) leaves the plan less than 8 MiB; one block
  // ahead leaves 10 MiB.
  LifetimeTrace trace = blocks_step(8);
  trace.ops[0].duration_ms = 60;
  for (SavedTensor& tensor : trace.tensors) tensor.offloadable = false;
  const std::int64_t usable = 24 * kMiB;
  const FitInputs inputs = eight_blocks(usable, std::int64_t{1} << 40, ParameterPlacement::kHost, trace);
  const std::vector<FitOption> options = weigh_fit(inputs);
  const FitOption* feasible = first_feasible(options);
  ASSERT_NE(feasible, nullptr) << options.front().reason;
  EXPECT_EQ(feasible->parameter_prefetch, 1u);
  EXPECT_EQ(feasible->window_bytes, 2 * 4 * kMiB + 4 * kMiB);
}

}  // namespace
}  // namespace stowage::planner
