#include "planner/step_ledger.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

namespace stowage::planner {
namespace {

using Keys = std::vector<StepLedger::Key>;

std::vector<TraceOp> ops_of(const StepLedger& ledger) { return std::vector<TraceOp>(ledger.ops()); }

TEST(StepLedger, AProducerItsLastForwardUseAndItsBackwardUsesAreRecorded) {
  StepLedger ledger;
  ledger.op_ran(Phase::kForward, Keys{}, Keys{100});      // op 0 makes 100
  ledger.op_ran(Phase::kForward, Keys{100}, Keys{200});   // op 1 uses it
  const auto saved = ledger.save(100, 64, kNoRegion);     // saved after op 1
  ASSERT_TRUE(saved);
  ledger.op_ran(Phase::kForward, Keys{100}, Keys{});      // op 2: its last forward use
  ledger.taken_back(*saved);                              // backward unpacks it before op 3
  ledger.op_ran(Phase::kBackward, Keys{100}, Keys{});     // op 3
  ledger.op_ran(Phase::kBackward, Keys{100}, Keys{});     // op 4: its last backward use
  const StepRecording recording = ledger.recording(ops_of(ledger), {});
  ASSERT_EQ(recording.storages.size(), 1u);
  const RecordedStorage& storage = recording.storages[0];
  EXPECT_EQ(storage.bytes, 64u);
  EXPECT_EQ(storage.producer, 0u);
  EXPECT_EQ(storage.last_forward, 2u);
  EXPECT_EQ(storage.first_backward, 3u);
  EXPECT_EQ(storage.last_backward, 4u);
  EXPECT_EQ(storage.save_ops, (std::vector<std::int64_t>{1}));
  EXPECT_EQ(storage.save_regions, (std::vector<std::int32_t>{kNoRegion}));
}

TEST(StepLedger, ParametersAndStoragelessTensorsAreNeverSaved) {
  StepLedger ledger;
  ledger.add_fixed(7);
  EXPECT_FALSE(ledger.save(7, 8, kNoRegion));
  EXPECT_FALSE(ledger.save(0, 8, kNoRegion));
  EXPECT_TRUE(ledger.recording({}, {}).storages.empty());
}

TEST(StepLedger, EachSaveKeepsItsSiteAndAFixedStoragesSitesInAModuleAreKeptSaves) {
  StepLedger ledger;
  ledger.add_fixed(7);
  ledger.op_ran(Phase::kForward, Keys{}, Keys{100});
  const auto saved = ledger.save(100, 64, kNoRegion, {"blocks.0", 0, 1});
  ledger.save(100, 64, kNoRegion, {"blocks.1", 0, 0});
  EXPECT_FALSE(ledger.save(7, 8, kNoRegion, {"blocks.0", 0, 0}));
  EXPECT_FALSE(ledger.save(7, 8, kNoRegion, kOutsideModules));  // outside modules: no plan looks for it
  const StepRecording recording = ledger.recording(ops_of(ledger), {});
  ASSERT_TRUE(saved);
  EXPECT_EQ(recording.storages[0].sites, (std::vector<SaveSite>{{"blocks.0", 0, 1}, {"blocks.1", 0, 0}}));
  EXPECT_EQ(recording.fixed_saves, (std::vector<SaveSite>{{"blocks.0", 0, 0}}));
}

TEST(StepLedger, ASavedStorageFreedInBackwardMovesOutOfItsAddress) {
  StepLedger ledger;
  ledger.op_ran(Phase::kForward, Keys{}, Keys{100});  // op 0
  const std::int32_t region = ledger.enter_region(Keys{100, 0});
  const auto first = ledger.save(100, 64, region);
  ledger.op_ran(Phase::kForward, Keys{}, Keys{300});  // op 1
  const auto second = ledger.save(300, 32, kNoRegion);
  ledger.op_ran(Phase::kBackward, Keys{100}, Keys{});  // op 2 takes 100
  ledger.op_ran(Phase::kBackward, Keys{}, Keys{100});  // op 3 makes a new storage at 100: the old one was freed
  ledger.op_ran(Phase::kBackward, Keys{100}, Keys{});  // op 4: not a use of the moved storage
  // The moved storage comes after the one saved before its move.
  EXPECT_EQ(ledger.storage_order(), (std::vector<std::size_t>{*second, *first}));
  RecordedRegion block;
  block.module = "blocks.0";
  const StepRecording recording = ledger.recording(ops_of(ledger), {block});
  ASSERT_EQ(recording.storages.size(), 2u);
  EXPECT_EQ(recording.storages[1].producer, 0u);
  EXPECT_EQ(recording.storages[1].last_backward, 2u);
  EXPECT_EQ(recording.regions[0].inputs, (std::vector<std::int64_t>{1}));  // follows the move
  EXPECT_EQ(recording.regions[0].module, "blocks.0");
}

TEST(StepLedger, AStorageMadeAtASavedAddressInForwardChangesNothing) {
  StepLedger ledger;
  ledger.op_ran(Phase::kForward, Keys{}, Keys{100});
  ledger.save(100, 64, kNoRegion);
  ledger.op_ran(Phase::kForward, Keys{}, Keys{100});  // in forward: the saved storage is alive
  const StepRecording recording = ledger.recording(ops_of(ledger), {});
  EXPECT_EQ(recording.storages[0].producer, 0u);
  EXPECT_EQ(recording.storages[0].last_forward, 0u);
}

TEST(StepLedger, AStorageMadeOutsideTheOpsHasNoProducerWhateverLivedAtItsAddressBefore) {
  StepLedger ledger;
  ledger.op_ran(Phase::kForward, Keys{}, Keys{100});          // op 0 makes 100, freed unsaved
  ledger.made_outside_ops(Phase::kForward, Keys{100, 0});     // a lifted constant takes its address
  const auto lifted = ledger.save(100, 8, kNoRegion);
  ledger.op_ran(Phase::kForward, Keys{100}, Keys{200});       // op 1 uses it
  ledger.save(200, 8, kNoRegion);
  ledger.made_outside_ops(Phase::kForward, Keys{200});        // a saved storage's address in forward: it lives
  ledger.taken_back(*lifted);
  ledger.op_ran(Phase::kBackward, Keys{100}, Keys{});         // op 2
  ledger.made_outside_ops(Phase::kBackward, Keys{100});       // after forward: the saved one was freed
  ledger.op_ran(Phase::kBackward, Keys{100}, Keys{});         // op 3: not its use
  EXPECT_EQ(ledger.ops(), 4u);                                // made outside the ops: no op counted
  const StepRecording recording = ledger.recording(ops_of(ledger), {});
  ASSERT_EQ(recording.storages.size(), 2u);
  EXPECT_EQ(recording.storages[0].producer, 1u);  // 200, untouched
  const RecordedStorage& moved = recording.storages[1];
  EXPECT_FALSE(moved.producer.has_value());
  EXPECT_EQ(moved.last_forward, 1u);
  EXPECT_EQ(moved.last_backward, 2u);
}

TEST(StepLedger, ABlockWritingItsInputIsSeen) {
  StepLedger ledger;
  ledger.add_fixed(5);
  const std::int32_t region = ledger.enter_region(Keys{5, 9});
  EXPECT_TRUE(ledger.writes_input(region, Keys{9}));
  EXPECT_FALSE(ledger.writes_input(region, Keys{5}));  // a parameter is no input of the block's
  EXPECT_THROW((void)ledger.writes_input(region + 1, Keys{9}), std::exception);
}

TEST(StepLedger, RepeatedSavesAddOpsAndRegionsOnce) {
  StepLedger ledger;
  ledger.op_ran(Phase::kForward, Keys{}, Keys{100});
  ledger.save(100, 64, 2);
  ledger.save(100, 64, 0);
  ledger.op_ran(Phase::kForward, Keys{100}, Keys{});
  ledger.save(100, 64, 2);
  const StepRecording recording = ledger.recording(ops_of(ledger), {});
  EXPECT_EQ(recording.storages[0].save_ops, (std::vector<std::int64_t>{0, 0, 1}));
  EXPECT_EQ(recording.storages[0].save_regions, (std::vector<std::int32_t>{0, 2}));
}

TEST(StepLedger, RecordingRefusesOpsOrRegionsThatDoNotMatch) {
  StepLedger ledger;
  ledger.op_ran(Phase::kForward, Keys{}, Keys{});
  EXPECT_THROW((void)ledger.recording({}, {}), std::exception);
  EXPECT_THROW((void)ledger.recording(ops_of(ledger), {RecordedRegion{}}), std::exception);
  EXPECT_THROW(ledger.taken_back(0), std::exception);
}

// A random step against a plain model of the rules: every storage's figures agree after each op.
TEST(StepLedger, RandomStepsAgreeWithAModelOfTheRules) {
  std::mt19937 random(11);
  for (int round = 0; round < 200; ++round) {
    StepLedger ledger;
    struct Model { std::optional<std::size_t> producer, last_forward, last_backward; };
    std::map<StepLedger::Key, Model> live;  // by address: what the ledger should say of each saved storage
    std::map<StepLedger::Key, std::size_t> saved_at;
    std::map<std::size_t, Model> expected;  // by the ledger's index
    std::map<StepLedger::Key, std::size_t> producer, last_forward;
    const int forward_ops = 5 + static_cast<int>(random() % 20);
    for (int op = 0; op < forward_ops; ++op) {
      const StepLedger::Key used = 1 + static_cast<StepLedger::Key>(random() % 6);
      const StepLedger::Key made = 1 + static_cast<StepLedger::Key>(random() % 6);
      const std::size_t index = ledger.ops();
      if (random() % 5 == 0) {  // made outside the step's ops: no producer, whatever was at the address
        ledger.made_outside_ops(Phase::kForward, Keys{made});
        if (!saved_at.contains(made)) {
          producer.erase(made);
          last_forward.erase(made);
        }
      } else {
        ledger.op_ran(Phase::kForward, Keys{used}, Keys{made});
        last_forward[used] = index;
        if (!saved_at.contains(made)) producer[made] = last_forward[made] = index;
      }
      if (random() % 3 == 0) {
        const auto storage = ledger.save(made, 8, kNoRegion);
        ASSERT_TRUE(storage);
        saved_at.emplace(made, *storage);
      }
    }
    for (const auto& [key, storage] : saved_at) {
      expected[storage] = {producer.contains(key) ? std::optional(producer[key]) : std::nullopt,
                           last_forward.contains(key) ? std::optional(last_forward[key]) : std::nullopt,
                           std::nullopt};
    }
    std::map<StepLedger::Key, std::size_t> alive = saved_at;
    for (int op = 0; op < 15; ++op) {
      const StepLedger::Key key = 1 + static_cast<StepLedger::Key>(random() % 6);
      const bool makes = random() % 4 == 0;
      const std::size_t index = ledger.ops();
      if (makes && random() % 2 == 0) {
        ledger.made_outside_ops(Phase::kBackward, Keys{key});
      } else {
        ledger.op_ran(Phase::kBackward, makes ? Keys{} : Keys{key}, makes ? Keys{key} : Keys{});
      }
      if (const auto found = alive.find(key); found != alive.end()) {
        if (makes) {
          alive.erase(found);
        } else {
          expected[found->second].last_backward = index;
        }
      }
    }
    const StepRecording recording = ledger.recording(ops_of(ledger), {});
    const std::vector<std::size_t> order = ledger.storage_order();
    ASSERT_EQ(order.size(), expected.size());
    for (std::size_t i = 0; i < order.size(); ++i) {
      const Model& model = expected[order[i]];
      const RecordedStorage& got = recording.storages[i];
      EXPECT_EQ(got.producer, model.producer) << round;
      EXPECT_EQ(got.last_forward, model.last_forward) << round;
      const auto last = model.last_backward == std::size_t{0} ? std::nullopt : model.last_backward;
      EXPECT_EQ(got.last_backward, last) << round;
    }
  }
}

}  // namespace
}  // namespace stowage::planner
