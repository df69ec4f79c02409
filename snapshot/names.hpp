// The strings the snapshot reader looks for: the snapshot's keys, the fields of segments, blocks
// and trace events, and the trace actions. A string read from a pickle is named once, when it is
// made (name_of), so that matching it later is an integer comparison.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace stowage::snapshot {

enum class Name : std::uint16_t {
  kOther = 0,  // any other string
  // A trace event's fields that the columns keep (stowage.snapshot_reader.columns), in this order.
  kAction,
  kAddr,
  kSize,
  kStream,
  kTimeUs,
  kFrames,
  kDeviceFree,
  kUserMetadata,
  // The snapshot's keys and its segments' and blocks' fields.
  kSegments,
  kDeviceTraces,
  kAddress,
  kTotalSize,
  kDevice,
  kBlocks,
  // Trace actions, in the order of their codes (TraceColumns.action).
  kAlloc,
  kFreeRequested,
  kFreeCompleted,
  kSegmentAlloc,
  kSegmentFree,
  kSegmentMap,
  kSegmentUnmap,
  kSnapshot,
  kOom,
  kCount,
};

// The event fields the columns keep, and the actions.
inline constexpr int kFieldCount = 8;
inline constexpr int kActionCount = 9;
inline constexpr int kNameCount = static_cast<int>(Name::kCount);

// The Name of a string (its UTF-8 bytes); kOther for any other.
Name name_of(std::string_view text);
// The text of a Name (kOther: "").
std::string_view text_of(Name name);

// A kept field's slot, 0 to kFieldCount - 1, or nullopt for any other name.
inline std::optional<int> field_slot(Name name) {
  const int value = static_cast<int>(name) - static_cast<int>(Name::kAction);
  if (value < 0 || value >= kFieldCount) return std::nullopt;
  return value;
}

// An action's code (its index in stowage.snapshot_reader.ACTIONS), or nullopt.
inline std::optional<std::uint8_t> action_code(Name name) {
  const int value = static_cast<int>(name) - static_cast<int>(Name::kAlloc);
  if (value < 0 || value >= kActionCount) return std::nullopt;
  return static_cast<std::uint8_t>(value);
}

}  // namespace stowage::snapshot
