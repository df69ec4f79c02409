// A device's trace events as columns (stowage.snapshot_reader.columns.TraceColumns), as the
// reader makes them: one row an event, and the distinct stacks of all traces.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "snapshot/objects.hpp"
#include "snapshot/pod_column.hpp"

namespace stowage::snapshot {

// TraceColumns.flags: which optional fields an event had, and the type of its time.
inline constexpr std::uint8_t kHasAddr = 1, kHasSize = 2, kHasStream = 4, kHasDeviceFree = 8;
inline constexpr std::uint8_t kTimeInt = 16, kTimeFloat = 32, kTimeBool = 64, kHasFrames = 128;
// TraceColumns.stack: an index into the stacks, or one of these.
inline constexpr std::int32_t kNoStack = -1;      // no frames, or an empty list
inline constexpr std::int32_t kFramesNone = -2;   // frames None
inline constexpr std::int32_t kUnstored = -3;     // (a frames list's stack, not made yet)

// One trace event as a row. `metadata` (when `has_metadata`) is the event's user_metadata,
// borrowed until the row is added.
struct Row {
  std::uint8_t action = 0;
  std::uint8_t flags = 0;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::int64_t time = 0;  // an int time, or a float time's bits
  std::int32_t stack = kNoStack;
  std::uint64_t device_free = 0;
  bool has_metadata = false;
  Handle metadata = nullptr;
};

// The distinct stacks of a snapshot's trace events: a frames list is stored once however many
// events carry an equal one (equal: the same frame objects, as the pickle's memo shares them).
// Holds a reference to each frame; clear() gives them back. Not thread-safe.
class StackTable {
 public:
  // The index of the stack of these frames (dicts), stored if new; kNoStack for none.
  std::int32_t index_of(std::span<const Handle> frames, Objects& objects);
  const std::vector<std::vector<Handle>>& stacks() const { return stacks_; }
  // What the stacks take as Python lists, once made: 72 bytes and 8 a frame each.
  std::uint64_t planned_bytes() const { return 72 * stacks_.size() + 8 * frames_; }
  void clear(Objects& objects);

 private:
  std::vector<std::vector<Handle>> stacks_;
  std::unordered_multimap<std::uint64_t, std::int32_t> by_hash_;
  std::uint64_t frames_ = 0;
};

// The rows of one device's trace as they are read, and what the plain-data walk would count of
// its events (TraceShape in snapshot/plain_walk.hpp). Rows after the first bad event are not
// kept (the trace is refused by its message). Holds a reference to each kept user_metadata
// object and each counted container; clear() gives them back. Not thread-safe.
class TraceColumnsBuilder {
 public:
  explicit TraceColumnsBuilder(std::int64_t device) : device_(device) {}

  std::int64_t device() const { return device_; }
  std::uint64_t count() const { return count_; }
  bool failed() const { return error_.has_value(); }
  const std::optional<std::string>& error() const { return error_; }

  // Adds the next event's row (taking a reference to its metadata object).
  void add(const Row& row, Objects& objects);
  // The next event is malformed: the trace is refused with `message`, and keeps no more rows.
  void fail(std::string message);
  // What the walk counts of the next event (add or fail it after): `nodes` values, its stack
  // (kNoStack with `empty_frames` for an empty frames list), and its metadata container (held
  // until clear(), so that the walk can reach it).
  void count_shape(std::uint64_t nodes, std::int32_t stack, bool empty_frames, Handle container,
                   Objects& objects);
  void clear(Objects& objects);

  PodColumn<std::uint8_t> action, flags;
  PodColumn<std::uint64_t> addr, size, stream;
  PodColumn<std::int64_t> time;
  PodColumn<std::int32_t> stack;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> device_free;  // (event, value)
  std::vector<std::pair<std::uint64_t, Handle>> metadata;            // (event, object)

  // The shape: values, then how many events hold each stack, an empty frames list, each
  // metadata container.
  std::uint64_t nodes = 0;
  std::unordered_map<std::int32_t, std::uint64_t> stack_uses;
  std::uint64_t empty_frames = 0;
  std::unordered_map<Handle, std::uint64_t> container_uses;

 private:
  std::int64_t device_;
  std::uint64_t count_ = 0;
  std::optional<std::string> error_;
};

}  // namespace stowage::snapshot
