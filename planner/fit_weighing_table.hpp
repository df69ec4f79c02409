// What stowage.fit says of its weighing (planner/fit_weighing): the table it prints (where the
// parameters, gradients, optimizer states and activations live, how the batch runs, the step's
// predicted time, and every option weighed with its device and host bytes) and, where no option fits, the refusal that names
// each option's reason. Python prints the text; the words are tested there (tests/python/test_fit*).
//
// Contract: pure functions of their inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "planner/fit_weighing.hpp"

namespace stowage::planner {

// The load average while fit measured, and the cores the process may use.
using HostLoad = std::pair<double, std::int64_t>;

// What fit knows beside its options: where it ran, how it recorded the step, the memory figures.
struct FitFacts {
  std::string device;
  std::int64_t capacity = 0;
  std::string capacity_bound;       // which limit `capacity` is (the device's, the budget)
  std::string recorded;             // how the step was recorded
  std::string optimizer;            // the optimizer fit hands back, by its qualified name
  std::string states_kept_because;  // why the states cannot move to the host, or ""
  std::string tried;                // what the trials before training found, or ""
  std::optional<HostLoad> load;
  FitMemory memory;
  FitHost host;
  std::int64_t unplanned_peak = 0;  // the chosen micro-batch's step with nothing planned
  FitBlocks blocks;                 // the model's blocks, whose parameters an option may keep on the host
};

// The example batch as the table describes it.
struct FitBatch {
  std::int64_t rows = 0;
  std::optional<std::string> units;  // what its loss is a mean over; nullopt: it runs whole
  bool units_given = false;          // the caller said the units (loss_units=), unchecked
  std::string checked;               // what the cut check verified
  std::string not_cut;               // why it is not cut, or ""
};

// The chosen plan's predicted peak and each saved tensor's bytes, in the order of its decisions.
struct ChosenPlan {
  std::int64_t predicted_peak = 0;
  std::vector<std::int64_t> saved_bytes;
};

// What the predicted times are worth when the host was busy while fit measured them ("" when not).
std::string busy_host_note(const std::optional<HostLoad>& load);

// The table, `options[chosen]` the one taken (solved: its decisions match `plan`'s saved tensors).
std::string fit_table(const std::vector<FitOption>& options, std::size_t chosen, const ChosenPlan& plan,
                      const FitFacts& facts, const FitBatch& batch);

// Why no option fits: each option's reason, then what kept the states or the batch as they are,
// and where the host bounds the options with the parameters there, what the least of them needs.
std::string no_fit_message(const std::vector<FitOption>& options, const FitMemory& memory, std::int64_t unplanned,
                           const std::string& states_kept_because, const std::string& tried,
                           const std::string& whole);

}  // namespace stowage::planner
