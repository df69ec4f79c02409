// A plan: one decision per saved tensor of a trace, in the trace's order.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace stowage::planner {

enum class Decision : std::uint8_t {
  kKeep,       // stays on the device from forward to backward
  kOffload,    // offloaded to host memory after forward and back before backward needs it
  kRecompute,  // freed after its last forward use, made again in backward (with its chain)
};

using Plan = std::vector<Decision>;

constexpr std::string_view decision_name(Decision d) noexcept {
  switch (d) {
    case Decision::kKeep: return "keep";
    case Decision::kOffload: return "offload";
    case Decision::kRecompute: return "recompute";
  }
  return "?";
}

// The decision of this name ("keep", "offload", "recompute": the names the plan file and the
// printed plan use), or none.
constexpr std::optional<Decision> decision_named(std::string_view name) noexcept {
  for (const Decision d : {Decision::kKeep, Decision::kOffload, Decision::kRecompute}) {
    if (decision_name(d) == name) return d;
  }
  return std::nullopt;
}

}  // namespace stowage::planner
