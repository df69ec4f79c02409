// What the planner derives from a step's measured figures: the memory besides saved tensors, the
// recompute times of a region's tensors, op time lines, and the trace of a step recorded at a grid
// of sizes evaluated at other sizes (figures worked out by hand).
#include "planner/sized_trace.hpp"

#include <gtest/gtest.h>

#include "base/errors.hpp"
#include "planner/derived_quantities.hpp"
#include "planner/step_difference.hpp"
#include "planner/time_fit.hpp"

namespace stowage::planner {
namespace {

// F0 F1 F2 (region 0) | B2 B1 B0; tensor a made by F0 (100 bytes), b by F2 (50 bytes), both of
// region 0; F1 of region 0 makes nothing saved. Op i's io_bytes is `io * (i + 1)`.
LifetimeTrace three_and_three(std::uint64_t a_bytes, std::uint64_t io, std::int64_t in_use) {
  LifetimeTrace trace;
  for (int i = 0; i < 6; ++i) {
    TraceOp op{"op", "m", i < 3 ? Phase::kForward : Phase::kBackward, 1.0 + i, 0};
    op.region = i < 3 ? 0 : kNoRegion;
    op.io_bytes = io * static_cast<std::uint64_t>(i + 1);
    op.in_use_bytes = in_use;
    trace.ops.push_back(op);
  }
  SavedTensor a;
  a.module = "a";
  a.bytes = a_bytes;
  a.created = 0;
  a.last_forward_use = 1;
  a.first_backward_use = 4;
  a.last_backward_use = 5;
  a.region = 0;
  SavedTensor b = a;
  b.module = "b";
  b.bytes = 50;
  b.created = 2;
  b.last_forward_use = 2;
  b.first_backward_use = 3;
  b.last_backward_use = 3;
  trace.tensors = {a, b};
  return trace;
}

TEST(PlannerDerived, OtherBytesAreTheMemoryInUseLessTheSavedTensorsLiveThen) {
  LifetimeTrace trace = three_and_three(100, 1, 120);
  derive_other_bytes(trace);
  // a is live at ops 0-5, b at ops 2-3: 120 - 100 = 20, then 120 - 150 floors at 0.
  EXPECT_EQ(trace.ops[0].other_bytes, 20u);
  EXPECT_EQ(trace.ops[2].other_bytes, 0u);
  EXPECT_EQ(trace.ops[4].other_bytes, 20u);
  // Unchanged, the step holds 150 at op 2, more than the 120 measured there: the saved tensors count.
  EXPECT_EQ(unconstrained_peak_bytes(trace), 150u);
}

TEST(PlannerDerived, ARegionTensorsRecomputeTimeIsItsOpAndThoseSinceTheRegionsLastTensor) {
  LifetimeTrace trace = three_and_three(100, 1, 0);
  derive_recompute_times(trace);
  EXPECT_DOUBLE_EQ(trace.tensors[0].recompute_ms, 1.0);      // F0
  EXPECT_DOUBLE_EQ(trace.tensors[1].recompute_ms, 2.0 + 3.0);  // F1 and F2
  trace.tensors[1].region = kNoRegion;  // out of the region: its time is left as it was
  trace.tensors[1].recompute_ms = 7.0;
  derive_recompute_times(trace);
  EXPECT_DOUBLE_EQ(trace.tensors[1].recompute_ms, 7.0);
}

TEST(PlannerTimeFit, ALineThroughItsPointsNeverNegative) {
  const TimeLine line = fit_line({0, 10, 20}, {1, 2, 3});
  EXPECT_DOUBLE_EQ(line.fixed_ms, 1.0);
  EXPECT_DOUBLE_EQ(line.ms_per_byte, 0.1);
  const TimeLine falling = fit_line({0, 10}, {3, 1});  // slower with fewer bytes: noise, the mean
  EXPECT_DOUBLE_EQ(falling.fixed_ms, 2.0);
  EXPECT_DOUBLE_EQ(falling.ms_per_byte, 0.0);
  const TimeLine origin = fit_line({10, 20}, {1, 3});  // a negative intercept: through the origin
  EXPECT_DOUBLE_EQ(origin.fixed_ms, 0.0);
  EXPECT_DOUBLE_EQ(origin.ms_per_byte, (10.0 + 60.0) / (100.0 + 400.0));
  EXPECT_THROW(fit_line({}, {}), LogicError);
}

TEST(PlannerSizedTrace, ByteCountsFollowTheGridsPolynomialAndTimesTheirKindsLine) {
  // batch 1 and 2: a's bytes 100 and 200, io 10 and 20 per op index, in use 300 and 500.
  const LifetimeTrace one = three_and_three(100, 10, 300);
  const LifetimeTrace two = three_and_three(200, 20, 500);
  const SizedTrace sized({{"batch", {1, 2}}}, {one, two});
  const SizedPoint at4 = sized.at({4});
  EXPECT_EQ(at4.trace.tensors[0].bytes, 400u);
  EXPECT_EQ(at4.trace.tensors[1].bytes, 50u);  // the same at every point
  EXPECT_EQ(at4.trace.ops[0].in_use_bytes, 900);
  EXPECT_EQ(at4.trace.ops[1].io_bytes, 80u);
  EXPECT_EQ(at4.trace.ops[0].other_bytes, 500u);  // 900 - 400
  EXPECT_EQ(at4.unconstrained_peak_bytes, 900u);
  const TimeLine line = fit_op_times({&one, &two}).at("op");  // every op is "op": one line
  EXPECT_GT(line.ms_per_byte, 0.0);
  EXPECT_DOUBLE_EQ(at4.trace.ops[1].duration_ms, line.at(80));
  EXPECT_DOUBLE_EQ(at4.trace.tensors[1].recompute_ms, at4.trace.ops[1].duration_ms + at4.trace.ops[2].duration_ms);
  EXPECT_EQ(sized.at({1}).trace.tensors[0].bytes, 100u);  // a grid point gives its own figures
}

TEST(PlannerSizedTrace, AByteCountIsFlooredAtTheLeastTheGridMeasured) {
  const SizedTrace sized({{"batch", {2, 4}}}, {three_and_three(200, 10, 300), three_and_three(300, 10, 300)});
  EXPECT_EQ(sized.at({1}).trace.tensors[0].bytes, 200u);  // the line says 150
}

TEST(PlannerSizedTrace, RefusesAGridThatIsNotOneAndSizesFarBeyondIt) {
  EXPECT_THROW(SizedTrace({{"batch", {1}}}, {three_and_three(1, 1, 1)}), LogicError);
  EXPECT_THROW(SizedTrace({{"batch", {1, 1}}}, {three_and_three(1, 1, 1), three_and_three(1, 1, 1)}), LogicError);
  EXPECT_THROW(SizedTrace({{"batch", {1, 2}}}, {three_and_three(1, 1, 1)}), LogicError);
  const SizedTrace sized({{"batch", {1, 2}}}, {three_and_three(1 << 20, 10, 300), three_and_three(2 << 20, 20, 500)});
  EXPECT_THROW(sized.at({1, 2}), LogicError);
  try {
    sized.at({std::int64_t{1} << 31});
    FAIL() << "a tensor of 2 PiB was not refused";
  } catch (const LogicError& error) {
    EXPECT_NE(std::string(error.what()).find("far beyond those recorded"), std::string::npos) << error.what();
  }
}

TEST(PlannerSizedTrace, RefusesSavedTensorsWhoseTotalPasses64Bits) {
  // 2**14 tensors of 2**36 bytes a batch: at a batch of 2**14 each holds 2**50 (the most one
  // may), and together 2**64 bytes, which a 64-bit sum would read as 0.
  const auto many = [](std::uint64_t batch) {
    LifetimeTrace trace = three_and_three(std::uint64_t{1} << 36, 10, 300);
    trace.tensors.resize(std::size_t{1} << 14, trace.tensors[0]);
    for (SavedTensor& tensor : trace.tensors) tensor.bytes = batch << 36;
    return trace;
  };
  const SizedTrace sized({{"batch", {1, 2}}}, {many(1), many(2)});
  EXPECT_EQ(sized.at({2}).trace.tensors.size(), std::size_t{1} << 14);
  try {
    sized.at({std::int64_t{1} << 14});
    FAIL() << "2**64 bytes of saved tensors were not refused";
  } catch (const LogicError& error) {
    EXPECT_NE(std::string(error.what()).find("far beyond those recorded"), std::string::npos) << error.what();
  }
}

// Whether a grid's recordings are one step (planner/step_difference.hpp): byte counts and times
// may differ, nothing else; the message names the first difference as the user reads it.
TEST(PlannerStepDifference, OnlyFiguresMayDifferAndTheFirstDifferenceIsNamed) {
  const LifetimeTrace first = three_and_three(100, 8, 0);
  EXPECT_EQ(step_difference(first, three_and_three(400, 64, 512), "batch=2", "batch=4"), std::nullopt);

  LifetimeTrace other = first;
  other.ops[4].name = "aten::mul.Tensor";
  EXPECT_EQ(step_difference(first, other, "batch=2", "batch=4"),
            "the step ran 6 ops at batch=2 and 6 at batch=4; the first to differ is op 4: op (m, backward) at "
            "batch=2, aten::mul.Tensor (m, backward) at batch=4.\nRecording at several sizes needs a step whose "
            "ops do not depend on its sizes (a size of 1 often changes them: broadcasting over it needs no "
            "reduction in backward)");
  other = first;
  other.ops.pop_back();
  EXPECT_NE(step_difference(first, other, "a", "b")->find("the first to differ is op 5: op (m, backward) at a, "
                                                          "no op (the step had ended) at b"),
            std::string::npos);

  other = first;
  other.tensors.pop_back();
  EXPECT_EQ(step_difference(first, other, "batch=2", "batch=4"),
            "the step saved 2 tensors at batch=2 and 1 at batch=4 (b saved 1 at batch=2 and 0 at batch=4)");

  other = first;
  other.tensors[1].packs = {{"it's", 0, 1}};
  EXPECT_EQ(step_difference(first, other, "batch=2", "batch=4"),
            "saved tensor 1 (b, made by op 2: op) differs in packs between batch=2 ([]) and batch=4 "
            "([(\"it's\", 0, 1)])");
  other.tensors[1].recomputable = false;
  EXPECT_NE(step_difference(first, other, "x", "y")->find("differs in recomputable between x (True) and y (False)"),
            std::string::npos);

  other = first;
  other.regions.push_back({"blocks.0", 0, true, {}, {}});
  EXPECT_EQ(step_difference(first, other, "a", "b"), "the step's checkpoint regions differ between a and b");
}

}  // namespace
}  // namespace stowage::planner
