// Value: what the pickle machine holds on its stack and in its memo (snapshot/machine.hpp).
#pragma once

#include <cstdint>

#include "snapshot/names.hpp"
#include "snapshot/objects.hpp"

namespace stowage::snapshot {

// A value of the machine: numbers, None and booleans held as themselves (an object is made of one
// only when a container takes it); strings, bytes and containers as the Objects' handle, one
// reference each Value (kinds for which owns_handle() holds); the streaming reader's stand-ins
// by their index in its tables (trace_stream.hpp). Copying a Value does not take a reference:
// the machine retains and releases as Values are copied and dropped.
struct Value {
  Kind kind = Kind::kNone;
  std::uint8_t filled = 0;  // a tuple: 1 when it holds anything (() may be a dict key)
  // A str: its Name; a tuple: how deeply tuples nest in it (1 for a tuple of no tuples); an
  // event: its table slot's generation.
  std::uint16_t aux = 0;
  std::uint32_t index = 0;  // an event, event list or trace: its index in the stream's tables
  union {
    std::int64_t integer;  // kBool (0 or 1), kInt
    double real;           // kFloat
    Handle handle;         // kStr, kBytes, kTuple, kList, kDict
  };

  Value() : integer(0) {}

  static Value of_int(std::int64_t value) {
    Value made;
    made.kind = Kind::kInt;
    made.integer = value;
    return made;
  }
  static Value of_bool(bool value) {
    Value made;
    made.kind = Kind::kBool;
    made.integer = value ? 1 : 0;
    return made;
  }
  static Value of_float(double value) {
    Value made;
    made.kind = Kind::kFloat;
    made.real = value;
    return made;
  }
  static Value of_handle(Kind kind, Handle object) {
    Value made;
    made.kind = kind;
    made.handle = object;
    return made;
  }
  static Value of_index(Kind kind, std::uint32_t index) {
    Value made;
    made.kind = kind;
    made.index = index;
    return made;
  }

  Name name() const { return kind == Kind::kStr ? static_cast<Name>(aux) : Name::kOther; }
  bool is(Name wanted) const { return kind == Kind::kStr && static_cast<Name>(aux) == wanted; }
};

static_assert(sizeof(Value) == 16);

// Whether a Value of this kind holds a reference to an object.
inline bool owns_handle(Kind kind) {
  return kind == Kind::kStr || kind == Kind::kBytes || kind == Kind::kTuple ||
         kind == Kind::kList || kind == Kind::kDict || kind == Kind::kOther;
}

// A new reference to the object a plain Value stands for (made for a number, None or a boolean).
inline Handle new_reference(Objects& objects, const Value& value) {
  switch (value.kind) {
    case Kind::kNone: return objects.make_none();
    case Kind::kBool: return objects.make_bool(value.integer != 0);
    case Kind::kInt: return objects.make_int(value.integer);
    case Kind::kFloat: return objects.make_float(value.real);
    default: objects.retain(value.handle); return value.handle;
  }
}

// Whether a value of this kind is a container (for the format: not a scalar).
inline bool is_container(Kind kind) {
  return kind == Kind::kTuple || kind == Kind::kList || kind == Kind::kDict ||
         kind == Kind::kOther || kind >= Kind::kEvent;
}

}  // namespace stowage::snapshot
