// What stowage.fit says of its weighing (planner/fit_weighing_table): the table's rows and the
// refusal, word for word where Python's format specs are mirrored (widths, percentages, thousands);
// and of a fitted step that outgrows its plan (planner/fit_refusals).
#include "planner/fit_weighing_table.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/fit_refusals.hpp"

namespace stowage::planner {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

FitOption option(double fraction, std::int64_t micro_batches, std::int64_t micro_rows, std::string reason) {
  FitOption weighed;
  weighed.fraction = fraction;
  weighed.micro_batches = micro_batches;
  weighed.micro_rows = micro_rows;
  weighed.activation_budget = 64 * kMiB;
  weighed.device_state_bytes = fraction == 1.0 ? 16 * kMiB : 8 * kMiB;
  weighed.host_bytes = fraction == 1.0 ? 0 : 8 * kMiB;
  weighed.device_bytes = 20 * kMiB + weighed.device_state_bytes;
  weighed.update_ms = 2.0;
  weighed.reason = std::move(reason);
  weighed.solved = weighed.reason.empty();
  weighed.decisions = {Decision::kKeep, Decision::kRecompute, Decision::kOffload, Decision::kRecompute};
  weighed.prediction.step_ms = 10.5;
  return weighed;
}

FitFacts facts() {
  FitMemory memory{512 * kMiB, 20 * kMiB, 1048576, 4 * kMiB, 4 * kMiB, 4 * kMiB, {1048576}, {16 * kMiB}};
  return FitFacts{"cpu", 600 * kMiB, "the budget", "step recorded at batch 8", "torch.optim.adamw.AdamW", "", "",
                  HostLoad{6.0, 2}, memory, FitHost{8, 1024 * kMiB, "MemAvailable", 0, 3}, 3 * kMiB, FitBlocks{}};
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> found(1);
  for (char c : text) {
    if (c == '\n') {
      found.emplace_back();
    } else {
      found.back().push_back(c);
    }
  }
  return found;
}

TEST(PlannerFitWeighingTable, NamesABusyHostOnlyWhenTheLoadExceedsTheCores) {
  EXPECT_EQ(busy_host_note(HostLoad{1.5, 2}), "");
  EXPECT_EQ(busy_host_note(std::nullopt), "");
  const std::string note = busy_host_note(HostLoad{6.0, 2});
  EXPECT_NE(note.find("busy host (load 6.0 on 2 cores)"), std::string::npos) << note;
  EXPECT_NE(note.find("up to 3.0x long"), std::string::npos) << note;
}

TEST(PlannerFitWeighingTable, WritesEachRowAsFitPrintsIt) {
  const std::vector<FitOption> options{option(1.0, 1, 8, "the plan does not fit"), option(0.5, 2, 4, "")};
  const ChosenPlan plan{40 * kMiB, {kMiB, kMiB, 2 * kMiB, 0}};
  const FitBatch batch{8, "rows", false, "the whole example batch's loss", ""};
  const auto table = lines(fit_table(options, 1, plan, facts(), batch));
  ASSERT_EQ(table.size(), 12u);
  EXPECT_EQ(table[0], "stowage.fit on cpu: 600.00 MiB (the budget), 512.00 MiB usable; step recorded at batch 8");
  EXPECT_EQ(table[1], "  in use before the step     20.00 MiB  parameters (1,048,576), buffers, the batch");
  EXPECT_EQ(table[3], "  optimizer states            8.00 MiB  on the device; 8.00 MiB in host memory "
                      "(torch.optim.adamw.AdamW)");
  EXPECT_EQ(table[4], "  activations                64.00 MiB  budget; step adds 3.00 MiB unplanned -> 40.00 MiB "
                      "planned (saved bytes: keep 25%, recompute 25%, offload 50%)");
  EXPECT_EQ(table[6], "  batch                              8  2 micro-batches of up to 4 rows, gradients accumulated, "
                      "each loss weighted by its share of the batch's rows (verified: the whole example batch's loss)");
  EXPECT_EQ(table[7].substr(0, 41), "  predicted step                 23 ms  (");
  EXPECT_NE(table[7].find("(forward and backward 21 ms, optimizer update 2 ms); measured on a busy host"),
            std::string::npos);
  EXPECT_EQ(table[8], "");
  EXPECT_EQ(table[9], "  states on the device           parameters micro-batches activation budget  device memory"
                      "   host memory  predicted step");
  EXPECT_EQ(table[10], "  all (the factory's optimizer)      device     whole (8)         64.00 MiB      36.00 MiB"
                       "           0 B  the plan does not fit");
  EXPECT_EQ(table[11], "  50%                                device         2 x 4         64.00 MiB      28.00 MiB"
                       "      8.00 MiB           23 ms  <- chosen");
}

// The blocks' parameters on the host: 4 blocks of 1 MiB each, their gradients 1 MiB each.
FitOption on_host(std::string reason, std::int64_t host_bytes) {
  FitOption weighed = option(1.0, 1, 8, std::move(reason));
  weighed.parameters_on_host = true;
  weighed.device_state_bytes = 0;
  weighed.device_bytes = 16 * kMiB;
  weighed.window_bytes = 3 * kMiB;
  weighed.parameter_prefetch = 2;
  weighed.host_bytes = host_bytes;
  weighed.parameter_copy_ms = 4.0;
  return weighed;
}

TEST(PlannerFitWeighingTable, SaysWhereTheParametersLiveAndTheirBytes) {
  FitFacts with_blocks = facts();
  with_blocks.blocks =
      FitBlocks{4, 4 * kMiB, 4 * kMiB, 8 * kMiB, 1048576, kMiB, kMiB, {kMiB, kMiB, kMiB, kMiB}, {}, false};
  const std::vector<FitOption> options{option(1.0, 1, 8, "the optimizer's step does not fit"),
                                       on_host("", 16 * kMiB)};
  const FitBatch batch{8, std::nullopt, false, "", ""};
  const auto table = lines(fit_table(options, 1, ChosenPlan{40 * kMiB, {kMiB, kMiB, 2 * kMiB, 0}}, with_blocks, batch));
  ASSERT_EQ(table.size(), 13u);
  EXPECT_EQ(table[2], "  parameters on the host      4.00 MiB  of the model's 4 blocks: they live on the host "
                      "(stowage.offload.parameters, as under FSDP2's CPU offload), each block's brought in 2 blocks "
                      "ahead of its use, 3.00 MiB at most on the device; fitted.close() puts them back");
  EXPECT_EQ(table[3], "  gradients                        0 B  on the device, made in backward, freed after the "
                      "optimizer; the blocks' 4.00 MiB go to the host as made");
  EXPECT_NE(table[8].find("(forward and backward 10 ms, the parameters' copies waited for 4 ms, optimizer update 2 "
                          "ms)"), std::string::npos) << table[8];
  EXPECT_EQ(table[12], "  all (the factory's optimizer)        host     whole (8)         64.00 MiB      16.00 MiB"
                       "     16.00 MiB           16 ms  <- chosen");
}

TEST(PlannerFitWeighingTable, ARefusalWhereTheHostBoundsTheParametersOnItSaysWhatTheyNeedThere) {
  const std::string host = "the host cannot hold the offloaded parameters, gradients and states: 28.00 MiB needed, "
                           "20.00 MiB available (MemAvailable)";
  const std::vector<FitOption> options{option(1.0, 1, 8, "the optimizer's step does not fit"),
                                       on_host(host, 28 * kMiB), on_host(host, 30 * kMiB)};
  const auto found = lines(no_fit_message(options, facts().memory, 3 * kMiB, "", "", ""));
  EXPECT_EQ(found[2], "  100% of the states on the device, the blocks' parameters on the host (room for the step "
                      "64.00 MiB): " + host);
  EXPECT_EQ(found[4], "  (with the blocks' parameters on the host, the host is what bounds the step: it would need "
                      "28.00 MiB there; give the process more host memory (host_budget=, the cgroup's limit) or train "
                      "a smaller model)");
}

TEST(PlannerFitWeighingTable, RefusesNamingEveryOptionAndWhatKeptTheStates) {
  const std::vector<FitOption> options{option(1.0, 1, 8, "the host cannot hold the offloaded states"),
                                       option(0.5, 2, 4, "")};
  const std::string said = no_fit_message(options, facts().memory, 3 * kMiB, "offload_optimizer=False", "", "why");
  const auto found = lines(said);
  EXPECT_EQ(found[0], "stowage.fit: the step does not fit in 512.00 MiB usable (20.00 MiB in use before it, states "
                      "16.00 MiB, gradients 4.00 MiB, the step adding 3.00 MiB unplanned) with any share of optimizer "
                      "states on the device:");
  EXPECT_EQ(found[1], "  100% of the states on the device (room for the step 64.00 MiB): the host cannot hold the "
                      "offloaded states");
  EXPECT_EQ(found[2], "  50% of the states on the device, 2 micro-batches of 4 rows (room for the step 64.00 MiB): "
                      "fits here, not on every rank");
  EXPECT_EQ(found[3], "  (the states cannot move to host memory: offload_optimizer=False)");
  EXPECT_EQ(found[4], "  (the batch runs whole: why)");
  EXPECT_EQ(found[5], "Train on a smaller batch or sequence, or on a larger device, or give the offloaded states more "
                      "host memory.");
  const std::string plain = no_fit_message({options[1]}, facts().memory, 0, "", "", "");
  EXPECT_EQ(plain.substr(plain.rfind('\n') + 1), "Train on a smaller batch or sequence, or on a larger device.");
}

TEST(FitRefusals, AFittedStepOutOfMemorySaysWhatWasPlannedBesideWhatCame) {
  const BatchSizes planned{{"batch", 8}, {"seq", 512}};
  const std::string head = "OOM\nstowage.fit planned this step for batch 8 x seq 512 (its example batch)";
  EXPECT_EQ(fitted_out_of_memory("OOM", planned, std::nullopt, std::nullopt, 0),
            head + ": a larger batch needs stowage.fit again with it as the example.");
  EXPECT_EQ(fitted_out_of_memory("OOM", planned, std::nullopt, BatchSizes{}, 0), head + ".");
  const std::string larger = fitted_out_of_memory("OOM", planned, std::nullopt, BatchSizes{{"batch", 9}}, 0);
  EXPECT_NE(larger.find("; this batch is batch 9, larger."), std::string::npos) << larger;
  // cut into micro-batches, more rows run as more of them: only a longer sequence is larger
  const MicroCut cut{8, 2, 4};
  const std::string more_rows = fitted_out_of_memory("OOM", planned, cut, BatchSizes{{"batch", 16}, {"seq", 512}}, 3);
  EXPECT_NE(more_rows.find(" in micro-batches of up to 4 rows; this batch is batch 16 x seq 512, no larger"),
            std::string::npos) << more_rows;
  EXPECT_NE(more_rows.find("(3 steps departed"), std::string::npos) << more_rows;
  const std::string longer = fitted_out_of_memory("OOM", planned, cut, BatchSizes{{"batch", 2}, {"seq", 513}}, 0);
  EXPECT_NE(longer.find("x seq 513, larger."), std::string::npos) << longer;
}

TEST(FitRefusals, AStepThatCannotBeRecordedListsEachGridTried) {
  const std::string said = unrecordable_message({{"batch", 8}}, {{"batch {2, 3}", "RuntimeError: no"}}, false);
  EXPECT_NE(said.find("does not fit whole at batch 8, so fit records"), std::string::npos) << said;
  EXPECT_NE(said.find(":\n  at batch {2, 3}: RuntimeError: no\nfit cuts rows"), std::string::npos) << said;
  EXPECT_NE(unrecordable_message({{"batch", 8}}, {}, true).find("must run the same ops at each"), std::string::npos);
  EXPECT_NE(more_rows_refusal(9, MicroCut{16, 4, 4}).find("has 9 rows; fit planned micro-batches of 4 rows "
                                                          "(micro_batches=4 for the example's 16)"),
            std::string::npos);
}

}  // namespace
}  // namespace stowage::planner
