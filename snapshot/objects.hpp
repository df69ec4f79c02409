// Objects: the seam between the snapshot reader and the objects it builds (Note [Reading
// snapshots] in snapshot/reader.hpp). The reader decides what a pickle means and whether it is
// allowed; an Objects makes the plain data it stands for and reads it back. stowage._core makes
// Python objects (python/bindings/python_objects.cpp); the tests make C++ ones
// (tests/snapshot/tree_objects.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "snapshot/names.hpp"

namespace stowage::snapshot {

// What a value is. The plain kinds are what a snapshot holds; kOther is an object of any other
// type (only in data given to the format checks from outside a reading); the last five are the
// streaming reader's own stand-ins, never objects (Note [Streaming traces], trace_stream.hpp).
enum class Kind : std::uint8_t {
  kNone,
  kBool,
  kInt,
  kFloat,
  kStr,
  kBytes,
  kTuple,
  kList,
  kDict,
  kOther,
  kEvent,
  kEventList,
  kTrace,
  kDeviceTraces,
  kDead,  // a memo slot whose event became a row
};

// Python's name of a kind's type, as messages say it ("expected int, got NoneType").
const char* type_name(Kind kind);

// An object an Objects made, opaque to the reader.
using Handle = void*;

// A failure the pickle's bytes caused inside an Objects (text that does not decode, a key that
// cannot be hashed): the reader refuses the file with this reason.
class BadPickle : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An integer or a float read from text (protocols 0 and 1), as Python's int() and float() read it.
struct TextNumber {
  bool fits = true;         // an integer: whether it fits in 64 bits (`integer` holds it)
  std::int64_t integer = 0;
  double real = 0.0;
  std::string shown;        // how a message shows it, when it does not fit
};

// Makes plain data and reads it back, for one reading at a time. Handles are reference counted:
// every Handle a make_* call returns is a new reference that the caller gives back with
// release(); retain() takes another. The reader holds the interpreter's lock (if any) for the
// whole reading. Failures caused by the pickle throw BadPickle; others (out of memory, an
// interrupt) throw what the implementation throws, and end the reading.
class Objects {
 public:
  virtual ~Objects() = default;

  // --- making
  virtual Handle make_none() = 0;
  virtual Handle make_bool(bool value) = 0;
  virtual Handle make_int(std::int64_t value) = 0;
  virtual Handle make_float(double value) = 0;
  // A str from UTF-8 (lone surrogates allowed, as pickle writes them), or from ASCII (Python 2's
  // str); bytes.
  virtual Handle make_str(std::string_view utf8) = 0;
  virtual Handle make_ascii(std::string_view ascii) = 0;
  virtual Handle make_bytes(std::string_view bytes) = 0;
  virtual Handle make_list(std::span<const Handle> items) = 0;
  virtual Handle make_dict() = 0;
  virtual Handle make_tuple(std::span<const Handle> items) = 0;
  virtual void extend(Handle list, std::span<const Handle> items) = 0;
  // dict[key] = value; an unhashable key throws BadPickle.
  virtual void set_item(Handle dict, Handle key, Handle value) = 0;
  virtual void retain(Handle object) = 0;
  virtual void release(Handle object) = 0;

  // --- the text opcodes of protocols 0 and 1
  virtual TextNumber parse_int(std::string_view line) = 0;
  virtual TextNumber parse_float(std::string_view line) = 0;
  virtual Handle make_escaped_ascii(std::string_view quoted_body) = 0;  // STRING's argument
  virtual Handle make_raw_unicode_escape(std::string_view line) = 0;   // UNICODE's argument
  virtual std::string utf8_of(Handle str) = 0;

  // --- what messages show
  virtual std::string repr(Handle object) = 0;
  virtual std::string float_repr(double value) = 0;
  // A little-endian two's-complement integer too large for a snapshot, as a message shows it.
  virtual std::string long_repr(std::span<const std::uint8_t> little_endian) = 0;

  // --- reading back: the plain-data walk, the format checks, traces as columns
  virtual Kind kind_of(Handle object) = 0;
  // Whether more than one reference holds the object (only then can it be reached twice).
  virtual bool shared(Handle object) = 0;
  // A container's children, borrowed, appended to `out`, at most `most` (2 or more) a call: a
  // list's or tuple's items, a dict's keys then its values. `cursor` (0 for the first call) says
  // where the call begins and is moved past what it gave; returns whether any may remain (a call
  // may then give none). A container of millions is so walked without a copy of its children.
  virtual bool children(Handle container, std::size_t& cursor, std::size_t most, std::vector<Handle>& out) = 0;
  virtual std::size_t length(Handle container) = 0;
  virtual Handle item(Handle list_or_tuple, std::size_t index) = 0;  // borrowed
  virtual Handle find(Handle dict, Name key) = 0;                   // borrowed; nullptr: absent
  virtual Name name_of(Handle str) = 0;
  virtual bool same_str(Handle a, Handle b) = 0;
  // An int's value; `fits` false (and the value meaningless) where it is outside 64 bits.
  virtual std::int64_t int_of(Handle integer, bool& fits) = 0;
  // An int from 2**63 to 2**64 - 1 (beyond int_of); false for any other.
  virtual bool uint_of(Handle integer, std::uint64_t& value) = 0;
  virtual double float_of(Handle real) = 0;
  virtual std::string other_type_name(Handle object) = 0;  // for kOther
};

}  // namespace stowage::snapshot
