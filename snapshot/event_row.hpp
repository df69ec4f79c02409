// A trace event checked as the snapshot format requires, and made a row (stowage.snapshot_reader
// .schema names the same checks): the same messages, in the same order, whether the event was
// read into columns as it streamed or read as a dict.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "snapshot/names.hpp"
#include "snapshot/objects.hpp"
#include "snapshot/trace_columns.hpp"
#include "snapshot/value.hpp"

namespace stowage::snapshot {

// One field of an event as the checks read it. `handle` is borrowed (a str, bytes or a
// container; an int too large for 64 bits); `index` is a streamed event list's.
struct Field {
  bool present = false;
  Kind kind = Kind::kNone;
  Name name = Name::kOther;  // a str's
  bool fits = true;          // an int's: whether `integer` holds it
  std::int64_t integer = 0;
  double real = 0.0;
  Handle handle = nullptr;
  std::uint32_t index = 0;

  static Field of(const Value& value);             // a Value of the machine
  static Field of(Handle object, Objects& objects);  // an object (read back)
};

// An event's kept fields, in Name order from Name::kAction (field_slot).
using EventFields = std::array<Field, kFieldCount>;

// "device_traces[<device>][<index>]".
std::string event_where(std::int64_t device, std::uint64_t index);

// Checks an event and fills `row` with all but its stack; returns false with `error` set for a
// malformed one. Where the event's frames are a list (kList, kEventList) the caller finds the
// stack (check_frame for each frame), as it alone can read them. The format check of a whole
// snapshot (structure.hpp) leaves frames to the making of columns: `frames` false.
bool event_row(const EventFields& fields, std::int64_t device, std::uint64_t index,
               Objects& objects, Row& row, std::string& error, bool frames = true);

// An event dict's kept fields, read back.
EventFields fields_of(Handle event, Objects& objects);

// The message for a frame that is not a dict ("...frames[3]: expected dict, got int"), or "".
std::string check_frame(Kind kind, std::int64_t device, std::uint64_t index, std::size_t position);

// Python's "expected <expected>, got <type>" for `field` at `where`.
std::string expected(const std::string& where, const char* wanted, const Field& field, Objects& objects);

}  // namespace stowage::snapshot
