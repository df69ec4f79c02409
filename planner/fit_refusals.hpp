// What stowage.fit says when a step cannot be recorded, or outgrows what fit planned: the step
// does not fit even at the smallest size fit records it at; it could not be recorded at any
// smaller size; a fitted step ran out of memory (what fit planned beside what came); a forward of
// more rows than a micro-batch under ``with fitted:``. Python raises the text; the words are
// tested there (tests/python/test_fit*) and in tests/planner/fit_weighing_table_test.
//
// Contract: pure functions of their inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "planner/micro_cut.hpp"

namespace stowage::planner {

// A batch's sizes by name in order ("batch", then "seq" where it has one).
using BatchSizes = std::vector<std::pair<std::string, std::int64_t>>;

// Sizes as fit's messages show them: "batch 8 x seq 512".
std::string shown_sizes(const BatchSizes& sizes);

// The step does not fit even cut to `smallest`: `in_use` of `capacity` before it, `gradients`
// bytes more, `failure` the last recording's error.
std::string too_large_message(const BatchSizes& smallest, std::int64_t in_use, std::int64_t capacity,
                              std::int64_t gradients, const std::string& failure);

// The step at `full` does not fit whole, and no smaller grid could be recorded: each grid tried
// with its error; `steps_differ` where one failed for running other ops at other sizes.
std::string unrecordable_message(const BatchSizes& full, const std::vector<std::pair<std::string, std::string>>& tried,
                                 bool steps_differ);

// `error`, then what fit planned for (`planned`, the example's sizes, in micro-batches of `cut`
// where it cuts) and what came: `came` the batch's sizes (empty where it has none to read;
// nullopt where the step ran under ``with fitted:``, no batch seen); `departed` the steps that
// departed from the plan's trace.
std::string fitted_out_of_memory(const std::string& error, const BatchSizes& planned,
                                 const std::optional<MicroCut>& cut, const std::optional<BatchSizes>& came,
                                 std::int64_t departed);

// A forward of `rows` rows under ``with fitted:`` where fit planned micro-batches of `cut`.
std::string more_rows_refusal(std::int64_t rows, const MicroCut& cut);

}  // namespace stowage::planner
