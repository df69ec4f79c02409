// TreeObjects: the snapshot reader's objects as plain C++ values, for its tests.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "snapshot/objects.hpp"

namespace stowage::snapshot::testing {

// What an object holds: a kind and its value, or its children (a dict's as key, value, key, ...).
struct Node {
  Kind kind = Kind::kNone;
  std::int64_t integer = 0;
  double real = 0.0;
  std::string text;  // a str's UTF-8, a bytes' bytes
  std::vector<Handle> items;
  int references = 0;
};

// An Objects over Nodes that counts references and checks them: a reference given back twice, or
// a use of an object no one holds, fails the test (std::logic_error). Every node stays allocated
// until the TreeObjects goes (so that a stale handle is caught, not reused). Dict keys compare as
// Python's do for the kinds a pickle makes (1 == 1.0 == True). Not thread-safe.
class TreeObjects final : public Objects {
 public:
  TreeObjects() = default;
  TreeObjects(const TreeObjects&) = delete;
  TreeObjects& operator=(const TreeObjects&) = delete;
  ~TreeObjects() override;

  Handle make_none() override;
  Handle make_bool(bool value) override;
  Handle make_int(std::int64_t value) override;
  Handle make_float(double value) override;
  Handle make_str(std::string_view utf8) override;
  Handle make_ascii(std::string_view ascii) override;
  Handle make_bytes(std::string_view bytes) override;
  Handle make_list(std::span<const Handle> items) override;
  Handle make_dict() override;
  Handle make_tuple(std::span<const Handle> items) override;
  void extend(Handle list, std::span<const Handle> items) override;
  void set_item(Handle dict, Handle key, Handle value) override;
  void retain(Handle object) override;
  void release(Handle object) override;

  TextNumber parse_int(std::string_view line) override;
  TextNumber parse_float(std::string_view line) override;
  Handle make_escaped_ascii(std::string_view quoted_body) override;
  Handle make_raw_unicode_escape(std::string_view line) override;
  std::string utf8_of(Handle str) override;

  std::string repr(Handle object) override;
  std::string float_repr(double value) override;
  std::string long_repr(std::span<const std::uint8_t> little_endian) override;

  Kind kind_of(Handle object) override;
  bool shared(Handle object) override;
  bool children(Handle container, std::size_t& cursor, std::size_t most, std::vector<Handle>& out) override;
  std::size_t length(Handle container) override;
  Handle item(Handle list_or_tuple, std::size_t index) override;
  Handle find(Handle dict, Name key) override;
  Name name_of(Handle str) override;
  bool same_str(Handle a, Handle b) override;
  std::int64_t int_of(Handle integer, bool& fits) override;
  bool uint_of(Handle integer, std::uint64_t& value) override;
  double float_of(Handle real) override;
  std::string other_type_name(Handle object) override;

  // The objects anyone still holds from outside, and what they reach (not garbage cycles, which
  // Python's collector frees: a pickle can make a list that holds itself).
  std::size_t live() const;
  // The node a handle is (checked: someone holds it).
  const Node& node(Handle object) const;
  // A Python-like rendering of an object, for comparing results and messages.
  std::string show(Handle object) const;

 private:
  Handle make(Node node);
  Node& held(Handle object);
  const Node& held(Handle object) const;
  bool equal(Handle a, Handle b) const;

  std::vector<Node*> nodes_;
};

}  // namespace stowage::snapshot::testing
