// The simulator on traces small enough to work out by hand: four forward ops and four backward
// ops of 1 ms each, one or two saved tensors, and links whose copies take known times.
#include "planner/simulator.hpp"

#include <gtest/gtest.h>

#include "base/errors.hpp"

namespace stowage::planner {
namespace {

constexpr auto K = Decision::kKeep;
constexpr auto O = Decision::kOffload;
constexpr auto R = Decision::kRecompute;

// F0 F1 F2 F3 | B3 B2 B1 B0, 1 ms each, 10 bytes of other memory throughout. Tensor a: made by
// F0, last used by F1, needed by B1 (op 6) and B0 (op 7), 100 bytes, 0.5 ms to make again.
LifetimeTrace eight_ops() {
  LifetimeTrace trace;
  for (int i = 0; i < 8; ++i) {
    trace.ops.push_back({"op", "m", i < 4 ? Phase::kForward : Phase::kBackward, 1.0, 10});
  }
  SavedTensor a;
  a.module = "a";
  a.bytes = 100;
  a.created = 0;
  a.last_forward_use = 1;
  a.first_backward_use = 6;
  a.last_backward_use = 7;
  a.recompute_ms = 0.5;
  trace.tensors.push_back(a);
  return trace;
}

// A copy of `a` made by F2, last used by F2, needed by B2 (op 5) only.
SavedTensor made_by_f2(SavedTensor a) {
  a.created = 2;
  a.last_forward_use = 2;
  a.first_backward_use = 5;
  a.last_backward_use = 5;
  return a;
}

CostModel link(double to_host, double to_device, std::size_t prefetch = 2) {
  return {to_host, to_device, prefetch};
}

TEST(PlannerSimulator, KeptTensorIsLiveFromItsProducerToItsLastBackwardUse) {
  const LifetimeTrace trace = eight_ops();
  const CostModel cost = link(100, 100);
  Simulator simulator(trace, cost);
  const Simulation s = simulator.simulate({K});
  EXPECT_EQ(s.peak_bytes, 110u);
  EXPECT_EQ(s.peak_op, 0u);
  EXPECT_DOUBLE_EQ(s.step_ms, 8.0);
  for (const auto bytes : s.bytes_at_op) EXPECT_EQ(bytes, 110u);
}

TEST(PlannerSimulator, RecomputedTensorLeavesAGapAndCostsItsProducerBeforeItsFirstUse) {
  const LifetimeTrace trace = eight_ops();
  const CostModel cost = link(100, 100);
  Simulator simulator(trace, cost);
  const Simulation s = simulator.simulate({R});
  const std::vector<std::uint64_t> expected = {110, 110, 10, 10, 10, 10, 110, 110};
  EXPECT_EQ(s.bytes_at_op, expected);
  EXPECT_DOUBLE_EQ(s.recompute_ms, 0.5);
  EXPECT_DOUBLE_EQ(s.step_ms, 8.5);
}

TEST(PlannerSimulator, OffloadHiddenByTheComputeCostsNoTime) {
  // Out: starts when F0 ends (t=1), 1 ms, done during F1 -> freed after F1. In: issued at B3
  // (op 4, two before B1), t=4, done t=5, long before B1 starts at t=6.
  const LifetimeTrace trace = eight_ops();
  const CostModel cost = link(100, 100);
  Simulator simulator(trace, cost);
  const Simulation s = simulator.simulate({O});
  const std::vector<std::uint64_t> expected = {110, 110, 10, 10, 110, 110, 110, 110};
  EXPECT_EQ(s.bytes_at_op, expected);
  EXPECT_DOUBLE_EQ(s.step_ms, 8.0);
  EXPECT_DOUBLE_EQ(s.stall_ms, 0.0);
}

TEST(PlannerSimulator, AReloadLongerThanItsWindowStallsTheOpThatNeedsIt) {
  // In: 100 bytes at 20 bytes/ms = 5 ms from t=4: done t=9; B1 would start at t=6, waits 3 ms.
  const LifetimeTrace trace = eight_ops();
  const CostModel cost = link(100, 20);
  Simulator simulator(trace, cost);
  const Simulation s = simulator.simulate({O});
  EXPECT_DOUBLE_EQ(s.stall_ms, 3.0);
  EXPECT_DOUBLE_EQ(s.step_ms, 11.0);
}

TEST(PlannerSimulator, AnOffloadStillRunningWhenBackwardWantsItBackNeverFreedTheTensor) {
  // Out: 100 bytes at 10 bytes/ms from t=1: done t=11, after the reload would be issued (t=4).
  const LifetimeTrace trace = eight_ops();
  const CostModel cost = link(10, 100);
  Simulator simulator(trace, cost);
  const Simulation s = simulator.simulate({O});
  for (const auto bytes : s.bytes_at_op) EXPECT_EQ(bytes, 110u);
  EXPECT_DOUBLE_EQ(s.step_ms, 8.0);
}

TEST(PlannerSimulator, LinksCarryOneCopyAtATimeInEachDirection) {
  // Two tensors of 100 bytes made by F0 and F1, both needed first by B1 (op 6). Out at 50 bytes/ms:
  // a from t=1 to 3 (freed after F2), b from t=3 to 5 (done after forward ends at t=4: freed
  // during B3, op 4). In at 100 bytes/ms, both issued at op 4 (t=4): a 4-5, b 5-6.
  LifetimeTrace trace = eight_ops();
  SavedTensor b = trace.tensors[0];
  b.module = "b";
  b.created = 1;
  b.last_forward_use = 1;
  trace.tensors.push_back(b);
  const CostModel cost = link(50, 100);
  Simulator simulator(trace, cost);
  const Simulation s = simulator.simulate({O, O});
  // b's offload finished at t=5, after its reload's issue at t=4: it stayed resident.
  const std::vector<std::uint64_t> expected = {110, 210, 210, 110, 210, 210, 210, 210};
  EXPECT_EQ(s.bytes_at_op, expected);
  EXPECT_DOUBLE_EQ(s.step_ms, 8.0);
}

TEST(PlannerSimulator, RecomputingATensorRemakesTheChainItIsMadeFrom) {
  // b (made by F2 from a, needed first by B2 at op 5): recomputing both makes a before op 5 too.
  LifetimeTrace trace = eight_ops();
  SavedTensor b = trace.tensors[0];
  b.module = "b";
  b.created = 2;
  b.last_forward_use = 2;
  b.first_backward_use = 5;
  b.last_backward_use = 5;
  b.recompute_ms = 0.25;
  b.recompute_inputs = {0};
  trace.tensors.push_back(b);
  const CostModel cost = link(100, 100);
  Simulator simulator(trace, cost);
  const Simulation s = simulator.simulate({R, R});
  const std::vector<std::uint64_t> expected = {110, 110, 110, 10, 10, 210, 110, 110};
  EXPECT_EQ(s.bytes_at_op, expected);
  EXPECT_DOUBLE_EQ(s.recompute_ms, 0.75);
  EXPECT_DOUBLE_EQ(s.step_ms, 8.75);
  // Kept, a serves b's recomputation with no extra cost.
  const Simulation kept_input = simulator.simulate({K, R});
  EXPECT_DOUBLE_EQ(kept_input.recompute_ms, 0.25);
}

TEST(PlannerSimulator, AnOffloadedInputOfARecomputationIsDueWhenTheRecomputationRuns) {
  // b recomputed before op 5 needs a, offloaded: a's reload is issued at op 4 (5 - 2, but
  // not before backward starts) and must be done by op 5.
  LifetimeTrace trace = eight_ops();
  SavedTensor b = trace.tensors[0];
  b.created = 2;
  b.last_forward_use = 2;
  b.first_backward_use = 5;
  b.last_backward_use = 5;
  b.recompute_inputs = {0};
  trace.tensors.push_back(b);
  const CostModel cost = link(100, 20);  // a's reload: 5 ms from t=4, done t=9; op 5 waits 4 ms
  Simulator simulator(trace, cost);
  const Simulation s = simulator.simulate({O, R});
  EXPECT_DOUBLE_EQ(s.stall_ms, 4.0);
  EXPECT_DOUBLE_EQ(s.step_ms, 8.0 + 4.0 + 0.5);
}

TEST(PlannerSimulator, ReloadsComeBackAFixedNumberOfBuffersAhead) {
  // a (need op 6) and b (made by F2, last used by F2, needed by B2 = op 5), both offloaded, links
  // at 100 bytes/ms. Out: a 1-2 (freed after F1), b 3-4 (freed after F3). One buffer ahead: b's
  // reload is issued when backward starts (op 4), a's when b is first used (op 5).
  LifetimeTrace trace = eight_ops();
  trace.tensors.push_back(made_by_f2(trace.tensors[0]));
  const CostModel one_ahead = link(100, 100, 1);
  Simulator simulator(trace, one_ahead);
  const Simulation s = simulator.simulate({O, O});
  EXPECT_EQ(s.bytes_at_op, (std::vector<std::uint64_t>{110, 110, 110, 110, 110, 210, 110, 110}));
  EXPECT_DOUBLE_EQ(s.stall_ms, 0.0);
  // Two ahead: both come back when backward starts.
  const CostModel two_ahead = link(100, 100, 2);
  Simulator earlier(trace, two_ahead);
  EXPECT_EQ(earlier.simulate({O, O}).bytes_at_op[4], 210u);
}

TEST(PlannerSimulator, UnderACeilingBuffersComeBackAheadOnlyIntoRoomBelowIt) {
  // As above, two buffers ahead, under a ceiling of 150 bytes. When backward starts (op 4, 10 bytes
  // in use) b fits (110) and comes back; a would make 210 and ends the prefetch. At op 5 a still
  // does not fit beside b, so B1 (op 6) asks for it and waits 1 ms for its copy.
  LifetimeTrace trace = eight_ops();
  trace.tensors.push_back(made_by_f2(trace.tensors[0]));
  const CostModel two_ahead = link(100, 100, 2);
  Simulator unbounded(trace, two_ahead);
  const Simulation free_to_prefetch = unbounded.simulate({O, O});
  EXPECT_EQ(free_to_prefetch.peak_bytes, 210u);
  EXPECT_DOUBLE_EQ(free_to_prefetch.stall_ms, 0.0);
  Simulator bounded(trace, two_ahead, 150);
  const Simulation s = bounded.simulate({O, O});
  EXPECT_EQ(s.bytes_at_op, (std::vector<std::uint64_t>(8, 110)));
  EXPECT_DOUBLE_EQ(s.stall_ms, 1.0);
  EXPECT_DOUBLE_EQ(s.step_ms, 9.0);
}

TEST(PlannerSimulator, BuffersComeBackInTheOffloadersOrderNotTheOrderOfNeed) {
  // a (need op 6) and c (made by F2, last used by F2, needed by B0 = op 7 only), both offloaded,
  // one buffer ahead. The offloader returns the last offloaded first: c is asked for when backward
  // starts and held from op 4, a is fetched when B1 needs it (op 6), a 1 ms stall.
  LifetimeTrace trace = eight_ops();
  SavedTensor c = made_by_f2(trace.tensors[0]);
  c.first_backward_use = 7;
  c.last_backward_use = 7;
  trace.tensors.push_back(c);
  const CostModel one_ahead = link(100, 100, 1);
  Simulator simulator(trace, one_ahead);
  const Simulation s = simulator.simulate({O, O});
  EXPECT_EQ(s.bytes_at_op, (std::vector<std::uint64_t>{110, 110, 110, 110, 110, 110, 210, 210}));
  EXPECT_DOUBLE_EQ(s.stall_ms, 1.0);
  EXPECT_DOUBLE_EQ(s.step_ms, 9.0);
}

TEST(PlannerSimulator, ACheckpointRegionRemakesItsTensorsWhenItsBackwardBegins) {
  // a and b in region 0; b (made by F2, needed by B2 = op 5) is kept, a recomputed: the region's
  // backward begins at op 5, so a is made again there, not before its own first use (op 6).
  LifetimeTrace trace = eight_ops();
  trace.tensors[0].region = 0;
  trace.tensors.push_back(made_by_f2(trace.tensors[0]));
  const CostModel cost = link(100, 100);
  Simulator simulator(trace, cost);
  const Simulation s = simulator.simulate({R, K});
  EXPECT_EQ(s.bytes_at_op, (std::vector<std::uint64_t>{110, 110, 110, 110, 110, 210, 110, 110}));
  EXPECT_DOUBLE_EQ(s.recompute_ms, 0.5);
  EXPECT_DOUBLE_EQ(s.step_ms, 8.5);
  // A region recomputes or offloads, never both.
  EXPECT_THROW(simulator.simulate({R, O}), LogicError);
}

TEST(PlannerSimulator, BadTracesAndPlansAreRefusedWithTheirReason) {
  LifetimeTrace trace = eight_ops();
  trace.tensors[0].first_backward_use = 1;
  const CostModel cost = link(100, 100);
  EXPECT_THROW(Simulator(trace, cost), LogicError);
  trace = eight_ops();
  trace.tensors[0].recompute_inputs = {0};
  EXPECT_THROW(Simulator(trace, cost), LogicError);
  trace = eight_ops();
  trace.tensors[0].recomputable = false;
  Simulator simulator(trace, cost);
  EXPECT_THROW(simulator.simulate({R}), LogicError);
  EXPECT_THROW(simulator.simulate({K, K}), LogicError);
  const CostModel no_link = link(0, 100);
  EXPECT_THROW(Simulator(eight_ops(), no_link), LogicError);
}

}  // namespace
}  // namespace stowage::planner
