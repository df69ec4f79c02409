// DocumentView: a parsed JSON document (the planner's files: planner/file_formats.hpp) as the
// schema walker reads it, through handles, without copying it first.
//
// The planner knows no Python: stowage._core implements this over the objects json.loads made
// (python/bindings/plan_file_bindings.cpp), the tests over a small tree of their own. A document is
// read as it is given: nothing here parses or owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace stowage::planner {

// A value of the document, opaque to the planner: valid while the document is.
using DocNode = const void*;

// A value's kind, by its exact type: a value of any other type (a tuple, a subclass of int, a
// set) is kOther, and every spec refuses it (the walker asks the view how to name it).
enum class DocKind : std::uint8_t { kNull, kBool, kInt, kFloat, kStr, kList, kDict, kOther };

// Contract: reads one document for one walk, on one thread; a view is not shared. Each reading
// accessor is called only for a node of the kind it reads (as_int for kInt, and so on).
class DocumentView {
 public:
  virtual ~DocumentView() = default;

  virtual DocKind kind(DocNode node) = 0;
  virtual bool as_bool(DocNode node) = 0;
  // kInt: false for an integer beyond 64 bits, whose sign `negative` gives.
  virtual bool as_int(DocNode node, std::int64_t& value, bool& negative) = 0;
  virtual double as_float(DocNode node) = 0;
  // kStr: its text in UTF-8, valid until the next call; `characters` its length as the file
  // counts it (code points, not bytes).
  virtual std::string_view as_str(DocNode node, std::size_t& characters) = 0;
  virtual std::size_t length(DocNode list_or_dict) = 0;
  virtual DocNode item(DocNode list, std::size_t index) = 0;
  // An object's fields in order: false past the last; `cursor` starts at 0.
  virtual bool next_field(DocNode dict, std::size_t& cursor, DocNode& key, DocNode& value) = 0;
  // The value of field `key` of an object, or nullptr.
  virtual DocNode field(DocNode dict, std::string_view key) = 0;

  // Whether a value equals `text`, or `integer`, as the file's language compares them (in
  // Python, 1.0 and true equal 1): a header's format and version are compared so.
  virtual bool equals(DocNode node, std::string_view text) = 0;
  virtual bool equals(DocNode node, std::int64_t integer) = 0;
  // How a field's path names an object's key that is not a string (from a caller that did not
  // parse JSON): its text, in brackets when `index` (an integer).
  virtual std::string path_text(DocNode key, bool& index) = 0;

  // How a refusal quotes a value (stowage.validation.shown): short, control characters
  // escaped; and how it describes one of a kind it did not expect: its kind, then the value
  // quoted unless it is a list, an object or null ("an integer (3)", "a list").
  virtual std::string shown(DocNode node) = 0;
  virtual std::string described(DocNode node) = 0;
};

}  // namespace stowage::planner
