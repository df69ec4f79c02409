// PythonObjects: the snapshot reader's objects (snapshot/objects.hpp) as Python's.
#pragma once

#include <Python.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "snapshot/objects.hpp"

namespace stowage::python {

// Makes plain data as Python objects and reads it back, for one reading (the caller holds the
// GIL throughout). A failure the pickle's bytes caused (a TypeError, ValueError and the like,
// MemoryError among them, as the old reader counted it) becomes a BadPickle with Python's
// message; any other Python error (KeyboardInterrupt) is thrown as pybind11::error_already_set.
class PythonObjects final : public snapshot::Objects {
 public:
  PythonObjects();
  PythonObjects(const PythonObjects&) = delete;
  PythonObjects& operator=(const PythonObjects&) = delete;
  ~PythonObjects() override;

  snapshot::Handle make_none() override;
  snapshot::Handle make_bool(bool value) override;
  snapshot::Handle make_int(std::int64_t value) override;
  snapshot::Handle make_float(double value) override;
  snapshot::Handle make_str(std::string_view utf8) override;
  snapshot::Handle make_ascii(std::string_view ascii) override;
  snapshot::Handle make_bytes(std::string_view bytes) override;
  snapshot::Handle make_list(std::span<const snapshot::Handle> items) override;
  snapshot::Handle make_dict() override;
  snapshot::Handle make_tuple(std::span<const snapshot::Handle> items) override;
  void extend(snapshot::Handle list, std::span<const snapshot::Handle> items) override;
  void set_item(snapshot::Handle dict, snapshot::Handle key, snapshot::Handle value) override;
  void retain(snapshot::Handle object) override;
  void release(snapshot::Handle object) override;

  snapshot::TextNumber parse_int(std::string_view line) override;
  snapshot::TextNumber parse_float(std::string_view line) override;
  snapshot::Handle make_escaped_ascii(std::string_view quoted_body) override;
  snapshot::Handle make_raw_unicode_escape(std::string_view line) override;
  std::string utf8_of(snapshot::Handle str) override;

  std::string repr(snapshot::Handle object) override;
  std::string float_repr(double value) override;
  std::string long_repr(std::span<const std::uint8_t> little_endian) override;

  snapshot::Kind kind_of(snapshot::Handle object) override;
  bool shared(snapshot::Handle object) override;
  bool children(snapshot::Handle container, std::size_t& cursor, std::size_t most,
                std::vector<snapshot::Handle>& out) override;
  std::size_t length(snapshot::Handle container) override;
  snapshot::Handle item(snapshot::Handle list_or_tuple, std::size_t index) override;
  snapshot::Handle find(snapshot::Handle dict, snapshot::Name key) override;
  snapshot::Name name_of(snapshot::Handle str) override;
  bool same_str(snapshot::Handle a, snapshot::Handle b) override;
  std::int64_t int_of(snapshot::Handle integer, bool& fits) override;
  bool uint_of(snapshot::Handle integer, std::uint64_t& value) override;
  double float_of(snapshot::Handle real) override;
  std::string other_type_name(snapshot::Handle object) override;

 private:
  [[noreturn]] void fail();
  PyObject* made(PyObject* object);  // `object`, or fail() where it is null
  std::string number_shown(PyObject* integer);

  std::array<PyObject*, snapshot::kNameCount> names_{};  // an interned str each
  PyObject* name_ids_ = nullptr;                          // str -> its Name, as an int
};

// The Python object a Handle is.
inline PyObject* object(snapshot::Handle handle) { return static_cast<PyObject*>(handle); }

}  // namespace stowage::python
