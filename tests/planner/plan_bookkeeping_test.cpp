// What applying and printing a plan reads off its trace: the lookups a step is applied by
// (plan_lookup), which ops of a checkpointed call keep their outputs (region_policy), the bytes
// per module group and the reference plans (plan_report), and the departures told once each way
// (step_departures).
#include <gtest/gtest.h>

#include "planner/plan_lookup.hpp"
#include "planner/plan_report.hpp"
#include "planner/region_policy.hpp"
#include "planner/step_departures.hpp"

namespace stowage::planner {
namespace {

constexpr auto K = Decision::kKeep;
constexpr auto O = Decision::kOffload;
constexpr auto R = Decision::kRecompute;

// Two calls of block "blocks.0" (regions 0 and 1, three ops each) then their backward; tensor t
// made by forward op t, saved at ("blocks.0.fc", call, t % 3); tensor 3 is not recomputable.
LifetimeTrace two_block_calls() {
  LifetimeTrace trace;
  for (int i = 0; i < 6; ++i) {
    TraceOp op{"op", "blocks.0.fc", Phase::kForward, 1.0, 10};
    op.region = i / 3;
    op.region_op = i % 3;
    trace.ops.push_back(op);
  }
  for (int i = 0; i < 6; ++i) trace.ops.push_back({"op", "backward", Phase::kBackward, 1.0, 10});
  for (std::size_t t = 0; t < 6; ++t) {
    SavedTensor s;
    s.module = t < 3 ? "blocks.0.fc" : "blocks.1.fc";
    s.bytes = 100 * (t + 1);
    s.created = t;
    s.last_forward_use = t;
    s.first_backward_use = 11 - t;
    s.last_backward_use = 11 - t;
    s.recompute_ms = 0.5;
    s.recomputable = t != 3;
    s.offloadable = t != 5;
    s.region = static_cast<std::int32_t>(t / 3);
    s.packs = {{"blocks.0.fc", static_cast<std::int64_t>(t / 3), static_cast<std::int64_t>(t % 3)}};
    trace.tensors.push_back(s);
  }
  trace.regions = {{"blocks.0", 0, true, {"op", "op", "op"}, {}}, {"blocks.0", 1, true, {"op", "op", "op"}, {}}};
  trace.kept_saves = {{"embed", 0, 0}, {"", -1, 0}};
  trace.cost = {100, 100, 2};
  return trace;
}

TEST(PlanLookup, FindsEachSaveCheckpointsTheRecomputedCallsAndKeepsTheirOtherOps) {
  const LifetimeTrace trace = two_block_calls();
  const PlanLookup lookup = plan_lookup(trace, {K, R, K, K, O, O});
  EXPECT_EQ(lookup.unit_of_save.at({"blocks.0.fc", 1, 2}), 5u);
  EXPECT_EQ(lookup.unit_of_save.size(), 6u);
  EXPECT_TRUE(lookup.kept_saves.contains({"embed", 0, 0}));
  EXPECT_EQ(lookup.offloaded, (std::set<std::size_t>{4, 5}));
  ASSERT_EQ(lookup.checkpointed.size(), 1u);  // region 1 offloads: not checkpointed
  const CheckpointedCall& call = lookup.checkpointed.at({"blocks.0", 0});
  EXPECT_EQ(call.first, 0);
  EXPECT_EQ(call.second, (std::set<std::int32_t>{0, 2}));  // op 1's output is recomputed
  EXPECT_EQ(lookup.checkpointed_modules, std::vector<std::string>{"blocks.0"});
  EXPECT_EQ(lookup.recorded_calls, (std::map<std::string, std::int64_t>{
                                       {"", 0}, {"blocks.0", 2}, {"blocks.0.fc", 2}, {"embed", 1}}));
  EXPECT_TRUE(plan_lookup(trace, {K, K, K, K, K, K}).checkpointed.empty());
}

TEST(RegionPolicy, KeepsThePlansOpsAndEveryOpFromTheFirstOneNotRecordedThere) {
  StepDepartures departures;
  departures.begin_step();
  RegionPolicy policy({"aten::mm", "aten::gelu", "aten::mm", "aten::add"}, {0, 3}, departures, "blocks.2");
  EXPECT_TRUE(policy.keep("aten::mm"));
  EXPECT_FALSE(policy.keep("aten::gelu"));  // recomputed, as planned
  EXPECT_TRUE(policy.keep("aten::relu"));   // not the op recorded here: kept from here on
  EXPECT_TRUE(policy.keep("aten::add"));
  EXPECT_TRUE(policy.keep("aten::add"));    // past the recorded ops: kept, and not told again
  EXPECT_EQ(departures.this_step(), std::vector<std::string>{"blocks.2: op 2 is aten::relu, recorded aten::mm"});
  RegionPolicy longer({"aten::mm"}, {}, departures, "b");
  EXPECT_FALSE(longer.keep("aten::mm"));
  EXPECT_TRUE(longer.keep("aten::mm"));
  EXPECT_EQ(departures.this_step().back(), "b: op 1 is aten::mm, recorded nothing");
}

TEST(PlanReport, FoldsBlockIndicesAndDropsTheLeaf) {
  EXPECT_EQ(module_group("blocks.3.mlp.fc1"), "blocks.*.mlp");
  EXPECT_EQ(module_group("blocks.12"), "blocks");
  EXPECT_EQ(module_group("layers.0.1.attn"), "layers.*.*");
  EXPECT_EQ(module_group("3.fc"), "3");  // the first part is a name, not an index
  EXPECT_EQ(module_group("h.1x.fc"), "h.1x");
  EXPECT_EQ(module_group("fc"), "fc");
  EXPECT_EQ(module_group(""), "(top)");
}

TEST(PlanReport, SumsBytesPerGroupAndDecisionInTheOrderTheTraceNamesThem) {
  LifetimeTrace trace = two_block_calls();
  trace.tensors[1].module = "z.head";
  trace.tensors[2].module = "a.head";
  const std::vector<ModuleBytes> rows = bytes_by_module(trace, {K, R, K, K, O, O});
  ASSERT_EQ(rows.size(), 3u);  // blocks.0.fc and blocks.1.fc are blocks.*
  EXPECT_EQ(rows[1].group, "z");
  EXPECT_EQ(rows[1].recompute, 200u);
  EXPECT_EQ(rows[2].group, "a");
  EXPECT_EQ(rows[2].keep, 300u);
  EXPECT_EQ(rows[0].group, "blocks.*");
  EXPECT_EQ(rows[0].keep, 100u + 400u);
  EXPECT_EQ(rows[0].recompute, 0u);
  EXPECT_EQ(rows[0].offload, 500u + 600u);
}

TEST(PlanReport, SumsEveryTensorOfAGroup) {
  const LifetimeTrace trace = two_block_calls();
  const std::vector<ModuleBytes> rows = bytes_by_module(trace, {K, R, K, K, O, O});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].group, "blocks.*");
  EXPECT_EQ(rows[0].keep, 100u + 300u + 400u);
  EXPECT_EQ(rows[0].recompute, 200u);
  EXPECT_EQ(rows[0].offload, 500u + 600u);
}

TEST(PlanReport, ReferencePlansAreNoChangeFullCheckpointingAndOffloadEverything) {
  const LifetimeTrace trace = two_block_calls();
  const std::vector<ReferencePlan> plans = reference_plans(trace);
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_EQ(plans[0].name, "no change");
  EXPECT_EQ(plans[0].decisions, Plan(6, K));
  EXPECT_EQ(plans[1].name, "full checkpointing");
  EXPECT_EQ(plans[1].decisions, (Plan{R, R, R, K, R, R}));
  EXPECT_EQ(plans[2].name, "offload everything");
  EXPECT_EQ(plans[2].decisions, (Plan{O, O, O, O, O, K}));
  Simulator simulator(trace, trace.cost);
  for (const ReferencePlan& plan : plans) {
    EXPECT_EQ(plan.simulation.peak_bytes, simulator.simulate(plan.decisions).peak_bytes);
    EXPECT_DOUBLE_EQ(plan.simulation.step_ms, simulator.simulate(plan.decisions).step_ms);
  }
  EXPECT_LT(plans[1].simulation.peak_bytes, plans[0].simulation.peak_bytes);
}

TEST(StepDepartures, WarnsOnceForEachNewWayAndCountsEveryDepartedStep) {
  StepDepartures departures;
  departures.begin_step();
  EXPECT_EQ(departures.end_step(), std::nullopt);
  departures.begin_step();
  departures.note("a");
  departures.note("a");
  EXPECT_EQ(departures.this_step(), std::vector<std::string>{"a"});
  const std::optional<std::string> first = departures.end_step();
  ASSERT_TRUE(first.has_value());
  EXPECT_NE(first->find("step 2 does not match the lifetime trace the plan was made from (a)."), std::string::npos);
  EXPECT_NE(first->find("(1 of 2 so far)"), std::string::npos);
  departures.begin_step();
  departures.note("a");
  EXPECT_EQ(departures.end_step(), std::nullopt);  // said once for "a"
  departures.begin_step();
  for (const char* what : {"a", "b", "c", "d", "e"}) departures.note(what);
  const std::optional<std::string> later = departures.end_step();
  ASSERT_TRUE(later.has_value());
  EXPECT_NE(later->find("(b; c; d; and 1 more)"), std::string::npos);
  EXPECT_EQ(departures.steps(), 4);
  EXPECT_EQ(departures.departed_steps(), 3);
}

}  // namespace
}  // namespace stowage::planner
