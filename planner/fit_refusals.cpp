#include "planner/fit_refusals.hpp"

#include <algorithm>
#include <cstddef>

#include "base/byte_units.hpp"

namespace stowage::planner {

namespace {

std::string bytes_text(std::int64_t bytes) {
  return format_bytes(static_cast<std::size_t>(std::max<std::int64_t>(bytes, 0)));
}

}  // namespace

std::string shown_sizes(const BatchSizes& sizes) {
  std::string text;
  for (const auto& [name, value] : sizes) text += (text.empty() ? "" : " x ") + name + " " + std::to_string(value);
  return text;
}

std::string too_large_message(const BatchSizes& smallest, std::int64_t in_use, std::int64_t capacity,
                              std::int64_t gradients, const std::string& failure) {
  return "stowage.fit: the step does not fit as it is even cut to " + shown_sizes(smallest) +
         ", the smallest size fit records it at (a recording runs the step unplanned, with nothing offloaded). In "
         "use before it: " + bytes_text(in_use) + " of " + bytes_text(capacity) + "; its gradients add " +
         bytes_text(gradients) +
         ". The device cannot hold the model with the smallest step's activations: shard it over more devices "
         "(FSDP2), train it in lower precision, or on smaller inputs (shorter sequences, smaller images).\n(" +
         failure + ")";
}

std::string unrecordable_message(const BatchSizes& full, const std::vector<std::pair<std::string, std::string>>& tried,
                                 bool steps_differ) {
  std::string lines;
  for (const auto& [grid, failure] : tried) lines += (lines.empty() ? "  at " : "\n  at ") + grid + ": " + failure;
  const std::string advice =
      steps_differ
          ? "A step recorded at several sizes must run the same ops at each: a loss computed in a fixed number of "
            "chunks (not chunks of a fixed size), no branch on the sizes. Else: micro_batches='auto' (fit then "
            "records 2 and 3 rows at the example's own sequence length), an example batch whose step fits whole, "
            "or a device or budget the example's step fits in"
          : "fit cuts rows (the first dimension of every tensor with the example's rows) and sequences (the second "
            "dimension of integer tensors with the example's length): give a step that takes fewer of them, or a "
            "budget the example's step fits in whole";
  return "stowage.fit: the step does not fit whole at " + shown_sizes(full) +
         ", so fit records it on the example cut to smaller sizes, and it could not be recorded at any of them:\n" +
         lines + "\n" + advice;
}

std::string fitted_out_of_memory(const std::string& error, const BatchSizes& planned,
                                 const std::optional<MicroCut>& cut, const std::optional<BatchSizes>& came,
                                 std::int64_t departed) {
  std::string said = error + "\nstowage.fit planned this step for " + shown_sizes(planned) + " (its example batch)";
  if (cut) said += " in micro-batches of up to " + std::to_string(cut->most) + " rows";
  if (!came) return said + ": a larger batch needs stowage.fit again with it as the example.";
  if (came->empty()) return said + ".";
  bool larger = false;  // rows beyond the example's run as more micro-batches where fit cuts
  for (const auto& [name, value] : planned) {
    if (cut && name == "batch") continue;
    for (const auto& [other, size] : *came) larger = larger || (other == name && size > value);
  }
  if (larger) {
    return said + "; this batch is " + shown_sizes(*came) +
           ", larger. Give fit the largest batch the loop trains on as its example (stowage.fit(model, factory, "
           "largest_batch)), or cut this one.";
  }
  return said + "; this batch is " + shown_sizes(*came) + ", no larger: the step needed more than planned (" +
         std::to_string(departed) +
         " steps departed from the plan's lifetime trace). Fit again with a budget below the device's "
         "(stowage.fit(..., budget=...)) to leave more room.";
}

std::string more_rows_refusal(std::int64_t rows, const MicroCut& cut) {
  return "stowage.fit: this forward has " + std::to_string(rows) + " rows; fit planned micro-batches of " +
         std::to_string(cut.most) + " rows (micro_batches=" + std::to_string(cut.count) + " for the example's " +
         std::to_string(cut.rows) +
         "). Run the batch through fitted.step(batch) or fitted.backward(batch), or loop over "
         "fitted.micro_batches(batch) (each micro-batch's loss times its weight), or fit with micro_batches=1";
}

}  // namespace stowage::planner
