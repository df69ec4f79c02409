// Building a trace from a recorded step (Note [Building a trace]) on recordings small enough to
// follow by hand: which storages enter, how they group, which regions can be checkpointed.
#include "planner/trace_builder.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "base/errors.hpp"

namespace stowage::planner {
namespace {

// F0 F1 F2 (F1 and F2 in region 0) | B2 B1 B0, 1 ms each, 1000 bytes in use throughout.
StepRecording six_ops() {
  StepRecording recording;
  for (int i = 0; i < 6; ++i) {
    TraceOp op{"op" + std::to_string(i), "m", i < 3 ? Phase::kForward : Phase::kBackward, 1.0, 0};
    op.region = i == 1 || i == 2 ? 0 : kNoRegion;
    op.in_use_bytes = 1000;
    recording.ops.push_back(op);
  }
  recording.regions.push_back({"blocks.0", true, {}});
  return recording;
}

RecordedStorage storage(std::uint64_t bytes, std::optional<std::size_t> producer, std::size_t first_backward,
                        std::vector<std::int32_t> save_regions) {
  RecordedStorage s;
  s.bytes = bytes;
  s.producer = producer;
  s.first_backward = first_backward;
  s.save_ops = {static_cast<std::int64_t>(producer.value_or(0)), -1};  // -1: a save before the first op
  s.save_regions = std::move(save_regions);
  return s;
}

TEST(PlannerTraceBuilder, StoragesOfOneOpAreOneTensorAndThoseMadeBeforeTheStepAreLeftOut) {
  StepRecording recording = six_ops();
  recording.storages = {storage(100, 1, 4, {0}), storage(10, std::nullopt, 3, {kNoRegion}), storage(50, 1, 3, {0}),
                        storage(7, 0, 9, {kNoRegion})};  // the last: backward beyond the step
  recording.storages[0].last_backward = 5;
  const BuiltTrace built = build_trace(recording);
  ASSERT_EQ(built.trace.tensors.size(), 1u);
  const SavedTensor& t = built.trace.tensors[0];
  EXPECT_EQ(t.bytes, 150u);
  EXPECT_EQ(t.first_backward_use, 3u);
  EXPECT_EQ(t.last_backward_use, 5u);
  EXPECT_EQ(t.region, 0);
  EXPECT_TRUE(t.recomputable);
  EXPECT_DOUBLE_EQ(t.recompute_ms, 1.0);
  EXPECT_EQ(built.storages_of_tensor[0], (std::vector<std::size_t>{0, 2}));
  EXPECT_EQ(built.left_out, (std::vector<std::size_t>{1, 3}));
  EXPECT_EQ(built.trace.ops[2].other_bytes, 850u);
  EXPECT_EQ(built.unconstrained_peak_bytes, 1000u);
}

TEST(PlannerTraceBuilder, ATensorSavedOutsideItsRegionIsNotRecomputable) {
  StepRecording recording = six_ops();
  recording.storages = {storage(100, 2, 3, {0, kNoRegion})};
  const BuiltTrace built = build_trace(recording);
  EXPECT_EQ(built.trace.tensors[0].region, 0);
  EXPECT_FALSE(built.trace.tensors[0].recomputable);
  EXPECT_DOUBLE_EQ(built.trace.tensors[0].recompute_ms, 2.0);  // F1 and F2
}

TEST(PlannerTraceBuilder, ABlockIsCheckpointableOnlyWhenItsInputsAreSavedWithinItAndItRanOnce) {
  StepRecording recording = six_ops();
  recording.storages = {storage(100, 0, 5, {0}), storage(50, 2, 3, {0})};
  recording.regions[0].inputs = {0};
  BuiltTrace built = build_trace(recording);
  EXPECT_TRUE(built.region_checkpointable[0]);
  EXPECT_EQ(built.region_inputs[0], (std::vector<std::size_t>{0}));
  EXPECT_EQ(built.trace.tensors[1].recompute_inputs, (std::vector<std::size_t>{0}));

  recording.regions[0].inputs = {0, -1};  // an input autograd never saved
  built = build_trace(recording);
  EXPECT_FALSE(built.region_checkpointable[0]);
  EXPECT_EQ(built.trace.tensors[1].region, kNoRegion);  // its saves reach the offloader
  EXPECT_FALSE(built.trace.tensors[1].recomputable);

  recording.regions[0].inputs = {0};
  recording.regions.push_back({"blocks.0", true, {}});  // the block ran twice
  built = build_trace(recording);
  EXPECT_FALSE(built.region_checkpointable[0]);
}

TEST(PlannerTraceBuilder, TheTraceCarriesWhereEachTensorWasSavedTheKeptSavesAndTheRegionsOps) {
  StepRecording recording = six_ops();
  recording.storages = {storage(100, 1, 4, {0}), storage(10, std::nullopt, 3, {kNoRegion}), storage(50, 1, 3, {0})};
  recording.storages[0].sites = {{"blocks.0", 0, 2}};
  recording.storages[1].sites = {{"tokens", 0, 0}};
  recording.storages[2].sites = {{"blocks.0", 0, 0}, {"blocks.0.fc", 0, 0}};
  recording.fixed_saves = {{"blocks.0.fc", 0, 1}};
  recording.regions[0].call = 3;
  const LifetimeTrace trace = build_trace(recording).trace;
  ASSERT_EQ(trace.tensors.size(), 1u);
  EXPECT_EQ(trace.tensors[0].packs,
            (std::vector<SaveSite>{{"blocks.0", 0, 0}, {"blocks.0", 0, 2}, {"blocks.0.fc", 0, 0}}));  // sorted
  EXPECT_EQ(trace.kept_saves, (std::vector<SaveSite>{{"blocks.0.fc", 0, 1}, {"tokens", 0, 0}}));
  ASSERT_EQ(trace.regions.size(), 1u);
  EXPECT_EQ(trace.regions[0].module, "blocks.0");
  EXPECT_EQ(trace.regions[0].call, 3);
  EXPECT_EQ(trace.regions[0].ops, (std::vector<std::string>{"op1", "op2"}));
  EXPECT_EQ(trace.ops[2].region_op, 1);
  EXPECT_EQ(trace.ops[3].region_op, -1);
  EXPECT_EQ(trace.unconstrained_peak_bytes, 1000u);
}

TEST(PlannerTraceBuilder, RefusesARecordingThatPointsOutsideItself) {
  StepRecording recording = six_ops();
  recording.storages = {storage(100, 9, 3, {0})};
  EXPECT_THROW(build_trace(recording), LogicError);
}

}  // namespace
}  // namespace stowage::planner
