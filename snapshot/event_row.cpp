#include "snapshot/event_row.hpp"

#include <bit>

#include "snapshot/limits.hpp"

namespace stowage::snapshot {

namespace {

struct Range {
  Name name;
  const char* upper_text;  // the bound as Python prints it
  std::uint64_t upper;     // 0: 2**64
  std::uint8_t flag;
};

constexpr std::array<Range, 4> kRanges = {{
    {Name::kAddr, "18446744073709551616", 0, kHasAddr},
    {Name::kSize, "1125899906842624", kMaxSize, kHasSize},
    {Name::kStream, "18446744073709551616", 0, kHasStream},
    {Name::kDeviceFree, "18446744073709551616", 0, kHasDeviceFree},
}};

const Field& field_named(const EventFields& fields, Name name) {
  return fields[static_cast<std::size_t>(*field_slot(name))];
}

// A ranged field's value, or the message that refuses it.
bool ranged(const Field& field, const Range& range, const std::string& where, Objects& objects,
            std::uint64_t& value, std::string& error) {
  const std::string at = where + "." + std::string(text_of(range.name));
  if (field.kind != Kind::kInt) {
    error = expected(at, "int", field, objects);
    return false;
  }
  std::uint64_t big = 0;
  const bool unsigned_fits = !field.fits && field.handle != nullptr && objects.uint_of(field.handle, big);
  const bool in_range = field.fits ? field.integer >= 0 &&
                                         (range.upper == 0 || static_cast<std::uint64_t>(field.integer) < range.upper)
                                   : unsigned_fits && range.upper == 0;
  if (!in_range) {
    const std::string shown = field.fits ? std::to_string(field.integer) : objects.repr(field.handle);
    error = at + ": " + shown + " is out of range [0, " + range.upper_text + ")";
    return false;
  }
  value = field.fits ? static_cast<std::uint64_t>(field.integer) : big;
  return true;
}

bool check_action(const EventFields& fields, const std::string& where, Objects& objects, Row& row,
                  Name& action, std::string& error) {
  const Field& field = field_named(fields, Name::kAction);
  if (!field.present || field.kind == Kind::kNone) {
    error = where + ": missing 'action'";
    return false;
  }
  const std::optional<std::uint8_t> code = field.kind == Kind::kStr ? action_code(field.name) : std::nullopt;
  if (!code) {
    error = field.kind != Kind::kStr ? expected(where + ".action", "str", field, objects)
                                     : where + ".action: unknown action " + objects.repr(field.handle);
    return false;
  }
  row.action = *code;
  action = field.name;
  return true;
}

bool check_required(const EventFields& fields, Name action, const std::string& where, std::string& error) {
  const auto missing = [&](Name name) { return !field_named(fields, name).present; };
  if (action == Name::kOom) {
    if (missing(Name::kSize)) error = where + ": missing 'size'";
    else if (missing(Name::kAddr) && missing(Name::kDeviceFree)) error = where + ": missing 'device_free'";
  } else if (action != Name::kSnapshot) {
    if (missing(Name::kAddr)) error = where + ": missing 'addr'";
    else if (missing(Name::kSize)) error = where + ": missing 'size'";
  }
  return error.empty();
}

bool check_time(const Field& field, const std::string& where, Objects& objects, Row& row, std::string& error) {
  if (!field.present) return true;
  if (field.kind == Kind::kInt && field.fits) {
    row.flags |= kTimeInt;
    row.time = field.integer;
  } else if (field.kind == Kind::kInt) {
    error = where + ".time_us: " + objects.repr(field.handle) + " is out of range [-2**63, 2**63)";
    return false;
  } else if (field.kind == Kind::kFloat) {
    row.flags |= kTimeFloat;
    row.time = std::bit_cast<std::int64_t>(field.real);
  } else if (field.kind == Kind::kBool) {
    row.flags |= kTimeBool;
    row.time = field.integer;
  } else {
    error = expected(where + ".time_us", "int or float", field, objects);
    return false;
  }
  return true;
}

}  // namespace

Field Field::of(const Value& value) {
  Field field;
  field.present = true;
  field.kind = value.kind == Kind::kDead ? Kind::kOther : value.kind;
  field.name = value.name();
  if (value.kind == Kind::kInt || value.kind == Kind::kBool) field.integer = value.integer;
  if (value.kind == Kind::kFloat) field.real = value.real;
  if (owns_handle(value.kind)) field.handle = value.handle;
  field.index = value.index;
  return field;
}

Field Field::of(Handle object, Objects& objects) {
  Field field;
  field.present = true;
  field.kind = objects.kind_of(object);
  field.handle = object;
  if (field.kind == Kind::kStr) field.name = objects.name_of(object);
  if (field.kind == Kind::kInt) field.integer = objects.int_of(object, field.fits);
  if (field.kind == Kind::kBool) field.integer = objects.int_of(object, field.fits);
  if (field.kind == Kind::kFloat) field.real = objects.float_of(object);
  return field;
}

std::string event_where(std::int64_t device, std::uint64_t index) {
  return "device_traces[" + std::to_string(device) + "][" + std::to_string(index) + "]";
}

std::string expected(const std::string& where, const char* wanted, const Field& field, Objects& objects) {
  const std::string got = field.kind == Kind::kOther && field.handle != nullptr
                              ? objects.other_type_name(field.handle)
                              : std::string(type_name(field.kind));
  return where + ": expected " + wanted + ", got " + got;
}

std::string check_frame(Kind kind, std::int64_t device, std::uint64_t index, std::size_t position) {
  if (kind == Kind::kDict) return {};
  return event_where(device, index) + ".frames[" + std::to_string(position) + "]: expected dict, got " +
         type_name(kind);
}

EventFields fields_of(Handle event, Objects& objects) {
  EventFields fields;
  for (int slot = 0; slot < kFieldCount; ++slot) {
    const Handle found = objects.find(event, static_cast<Name>(static_cast<int>(Name::kAction) + slot));
    if (found != nullptr) fields[static_cast<std::size_t>(slot)] = Field::of(found, objects);
  }
  return fields;
}

bool event_row(const EventFields& fields, std::int64_t device, std::uint64_t index,
               Objects& objects, Row& row, std::string& error, bool check_frames) {
  const std::string where = event_where(device, index);
  row = Row{};
  Name action = Name::kOther;
  if (!check_action(fields, where, objects, row, action, error)) return false;
  if (!check_required(fields, action, where, error)) return false;
  std::uint64_t values[4] = {0, 0, 0, 0};
  for (std::size_t slot = 0; slot < kRanges.size(); ++slot) {
    const Field& field = field_named(fields, kRanges[slot].name);
    if (!field.present) continue;
    if (!ranged(field, kRanges[slot], where, objects, values[slot], error)) return false;
    row.flags |= kRanges[slot].flag;
  }
  row.addr = values[0];
  row.size = values[1];
  row.stream = values[2];
  row.device_free = values[3];
  if (!check_time(field_named(fields, Name::kTimeUs), where, objects, row, error)) return false;
  const Field& frames = field_named(fields, Name::kFrames);
  if (frames.present && check_frames) {
    row.flags |= kHasFrames;
    if (frames.kind == Kind::kNone) {
      row.stack = kFramesNone;
    } else if (frames.kind != Kind::kList && frames.kind != Kind::kEventList) {
      error = expected(where + ".frames", "list", frames, objects);
      return false;
    }
  }
  const Field& metadata = field_named(fields, Name::kUserMetadata);
  row.has_metadata = metadata.present;
  return true;
}

}  // namespace stowage::snapshot
