// A schema with bounds, for the JSON files the planner reads (planner/file_formats.hpp), walked
// over a DocumentView (Note [Schemas with bounds]).
//
// Note [Schemas with bounds]
// A schema is built of a few specs, each a type with its bounds:
//
//     IntSpec(low, high, why)     an integer (not a boolean) in [low, high]; `why`: the reason for high
//     NumberSpec(low, high, why)  an integer or a finite number in [low, high]
//     BoolSpec                    true or false
//     TextSpec(max_chars)         a string
//     ChoiceSpec(names)           one of these strings
//     ListSpec(item, max_items)   a list of items, at most max_items of them
//     RowSpec(items)              a list of exactly these items (a tuple, in the file)
//     RecordSpec(required, optional)  an object with these fields: required ones present, no others
//
// A bound is a number, or Bound::ref(index, why), a number the document itself sets (how many
// ops a trace has, for the index of an op), looked up in the `bounds` given to check(): a bound
// the file sets for itself is checked against the file. check() walks a document once, recursing
// no deeper than the schema's own (a list where a number belongs is refused, not walked), and
// returns the refusal naming the field (`tensors[3].bytes`), the value and the bound; the caller
// adds the file (Python's InputError). The walk costs nothing per field it accepts beyond the
// check itself: a field's path is built only for the refusal, as it unwinds.
//
// Contract: specs are immutable once built and may be shared between schemas and threads; a walk
// reads its document through the view it is given and nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "planner/document.hpp"

namespace stowage::planner {

// One step of a field's path: an item's index, or a field's name (a key that is neither is kept
// as the refusal shows it).
struct PathPart {
  bool index = false;
  std::string text;  // the index's digits, or the name
};

// What check() refuses: the field's path (empty: the whole document) and what is wrong with it.
struct Refusal {
  std::string field;
  std::string problem;
};

// A field refused: `problem`, and the path to it, innermost first, built as the walk unwinds (a
// spec defined elsewhere throws it from its walk).
struct Refused {
  std::string problem;
  std::vector<PathPart> path;
};

// ``tensors[3].bytes`` from `start` (a field's path, "" for none) and parts innermost first.
std::string field_path(const std::string& start, const std::vector<PathPart>& innermost_first);

// A count wide enough for any sum of a document's byte counts.
__extension__ typedef unsigned __int128 WideCount;

// The digits of `value` in groups of three, as Python's "{:,}" writes them.
std::string grouped(WideCount value);
std::string grouped(std::int64_t value);
// A number as Python's repr writes it: integers as "1000.0", others shortest round-trip.
std::string real_text(double value);
// One string from parts (appended: GCC 12 warns falsely on "literal" + std::string).
std::string joined(std::initializer_list<std::string_view> parts);

// An integer bound, a real one, or one the document sets (its index among check()'s bounds).
struct Bound {
  static Bound of(std::int64_t value) { return Bound{value, 0, false, -1, {}}; }
  static Bound of_real(double value) { return Bound{0, value, true, -1, {}}; }
  static Bound ref(int index, std::string why) { return Bound{0, 0, false, index, std::move(why)}; }

  std::int64_t integer;
  double real;
  bool is_real;
  int ref_index;        // >= 0: the document's own bound
  std::string ref_why;  // what it is, in a refusal ("the trace's last op")
};

using Bounds = std::span<const std::int64_t>;

class Spec {
 public:
  virtual ~Spec() = default;
  // Throws Refused for the first part of `value` outside this spec.
  virtual void walk(DocumentView& view, DocNode value, Bounds bounds) const = 0;
};

using SpecPtr = std::shared_ptr<const Spec>;

class IntSpec final : public Spec {
 public:
  IntSpec(Bound low, Bound high, std::string why = {});
  void walk(DocumentView& view, DocNode value, Bounds bounds) const override;

 private:
  Bound low_, high_;
  std::string why_;
  bool fixed_;
};

class NumberSpec final : public Spec {
 public:
  NumberSpec(Bound low, Bound high, std::string why = {});
  void walk(DocumentView& view, DocNode value, Bounds bounds) const override;

 private:
  Bound low_, high_;
  std::string why_;
};

class BoolSpec final : public Spec {
 public:
  void walk(DocumentView& view, DocNode value, Bounds bounds) const override;
};

class TextSpec final : public Spec {
 public:
  explicit TextSpec(std::size_t max_chars) : max_chars_(max_chars) {}
  void walk(DocumentView& view, DocNode value, Bounds bounds) const override;

 private:
  std::size_t max_chars_;
};

class ChoiceSpec final : public Spec {
 public:
  explicit ChoiceSpec(std::vector<std::string> names);
  void walk(DocumentView& view, DocNode value, Bounds bounds) const override;

 private:
  std::vector<std::string> names_;
  std::string listed_;  // "'forward', 'backward'"
};

class ListSpec final : public Spec {
 public:
  ListSpec(SpecPtr item, Bound max_items, std::size_t min_items = 0);
  void walk(DocumentView& view, DocNode value, Bounds bounds) const override;

 private:
  SpecPtr item_;
  Bound max_items_;
  std::size_t min_items_;
};

class RowSpec final : public Spec {
 public:
  explicit RowSpec(std::vector<SpecPtr> items) : items_(std::move(items)) {}
  void walk(DocumentView& view, DocNode value, Bounds bounds) const override;

 private:
  std::vector<SpecPtr> items_;
};

// A JSON object with the fields listed and no other.
class RecordSpec : public Spec {
 public:
  using Fields = std::vector<std::pair<std::string, SpecPtr>>;
  RecordSpec(Fields required, Fields optional = {});
  void walk(DocumentView& view, DocNode value, Bounds bounds) const override;

 private:
  // The field `name` is; nullptr for none.
  const std::pair<std::string, SpecPtr>* field_named(std::string_view name) const;

  Fields fields_;  // the required ones first
  std::size_t required_;
  std::string listed_;  // "name, module, phase"
};

// The refusal `value` earns under `spec`, its path below `field`; nullopt when it has none.
std::optional<Refusal> check(DocumentView& view, DocNode value, const Spec& spec, Bounds bounds = {},
                             const std::string& field = {});

// A refusal found outside a spec (a rule across fields): its path from `start` and `parts`
// (outermost first).
Refusal refuse(const std::string& start, std::vector<PathPart> outermost_first, std::string problem);
inline PathPart at_index(std::size_t index) { return PathPart{true, std::to_string(index)}; }
inline PathPart at_name(std::string name) { return PathPart{false, std::move(name)}; }

// "expected <what>, got <the value described>".
Refused wrong_kind(DocumentView& view, std::string_view expected, DocNode value);

}  // namespace stowage::planner
