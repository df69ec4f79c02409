// Readings of a pickle for the snapshot reader's tests: each loader's outcome as text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "snapshot/limits.hpp"
#include "snapshot/reader.hpp"
#include "snapshot/refusal.hpp"
#include "tests/snapshot/tree_objects.hpp"

namespace stowage::snapshot::testing {

// What a loader made of a pickle: "refused: <reason>", or the snapshot with its traces as rows.
struct Outcome {
  bool read = false;
  std::string text;
  bool read_twice = false;  // the columnar loader read it again as plain data
};

inline ReadOptions test_options() {
  ReadOptions options;
  options.memory.per_byte = kColumnsMemoryPerByte;
  return options;
}

// The snapshot (but its device_traces) and each trace's rows, frames shown as their frames.
inline std::string describe(const Reading& reading, TreeObjects& objects) {
  std::string out;
  const Node& root = objects.node(reading.root());
  if (root.kind != Kind::kDict) return objects.show(reading.root());
  for (std::size_t i = 0; i < root.items.size(); i += 2) {
    if (reading.device_traces() != nullptr && root.items[i + 1] == reading.device_traces()) continue;
    out += objects.show(root.items[i]) + ": " + objects.show(root.items[i + 1]) + "\n";
  }
  const auto& stacks = reading.stacks().stacks();
  for (const TraceColumnsBuilder* trace : reading.traces()) {
    out += "trace " + std::to_string(trace->device()) + "\n";
    for (std::size_t k = 0; k < trace->action.size(); ++k) {
      out += std::to_string(trace->action[k]) + " " + std::to_string(trace->flags[k]) + " " +
             std::to_string(trace->addr[k]) + " " + std::to_string(trace->size[k]) + " " +
             std::to_string(trace->stream[k]) + " " + std::to_string(trace->time[k]);
      const std::int32_t stack = trace->stack[k];
      out += " frames ";
      if (stack < 0) out += std::to_string(stack);
      for (const Handle frame : stack >= 0 ? stacks[static_cast<std::size_t>(stack)] : std::vector<Handle>{}) {
        out += objects.show(frame);
      }
      out += "\n";
    }
    for (const auto& [index, value] : trace->device_free) out += "free " + std::to_string(index) + " " + std::to_string(value) + "\n";
    for (const auto& [index, value] : trace->metadata) out += "meta " + std::to_string(index) + " " + objects.show(value) + "\n";
  }
  return out;
}

inline Outcome read_plain(std::string_view pickle, TreeObjects& objects) {
  MemoryBytes source(reinterpret_cast<const std::uint8_t*>(pickle.data()), pickle.size());
  try {
    Reading reading(objects);
    const Handle root = reading.plain(source, test_options());
    objects.release(root);  // the reading holds it too
    Reading columns(objects);
    columns.columns_of(root);
    return {true, describe(columns, objects)};
  } catch (const Refused& error) {
    return {false, "refused: " + error.message()};
  }
}

inline Outcome read_columns(std::string_view pickle, TreeObjects& objects) {
  MemoryBytes source(reinterpret_cast<const std::uint8_t*>(pickle.data()), pickle.size());
  try {
    Reading reading(objects);
    reading.columns(source, test_options());
    return {true, describe(reading, objects)};
  } catch (const Refused& error) {
    return {false, "refused: " + error.message()};
  } catch (const ReadWhole&) {
    Outcome again = read_plain(pickle, objects);
    again.read_twice = true;
    return again;
  }
}

}  // namespace stowage::snapshot::testing
