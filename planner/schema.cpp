#include "planner/schema.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <string_view>

namespace stowage::planner {

std::string joined(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (const std::string_view part : parts) out.append(part);
  return out;
}

namespace {

// A bound's value and how a refusal names it: "(why)" for a fixed upper bound's reason, ", why"
// for one the document sets.
struct Resolved {
  long double value;
  std::string text;
  std::string why;
};

Resolved resolve(const Bound& bound, Bounds bounds, const std::string& why = {}) {
  if (bound.ref_index >= 0) {
    const std::int64_t value = bounds[static_cast<std::size_t>(bound.ref_index)];
    return {static_cast<long double>(value), std::to_string(value), joined({", ", bound.ref_why})};
  }
  std::string reason = why.empty() ? std::string() : joined({" (", why, ")"});
  if (bound.is_real) return {static_cast<long double>(bound.real), real_text(bound.real), std::move(reason)};
  return {static_cast<long double>(bound.integer), std::to_string(bound.integer), std::move(reason)};
}

// A number of the document, exactly: an integer beyond 64 bits by its sign alone.
struct Number {
  long double value = 0;
  int beyond = 0;  // -1 or 1: an integer beyond 64 bits, below or above every bound
};

bool below(const Number& number, long double bound) {
  return number.beyond < 0 || (number.beyond == 0 && number.value < bound);
}
bool above(const Number& number, long double bound) {
  return number.beyond > 0 || (number.beyond == 0 && number.value > bound);
}

void check_range(DocumentView& view, DocNode value, const Number& number, const Bound& low, const Bound& high,
                 Bounds bounds, const std::string& why) {
  const Resolved lowest = resolve(low, bounds);
  if (below(number, lowest.value)) {
    throw Refused{joined({view.shown(value), " is below ", lowest.text, lowest.why}), {}};
  }
  const Resolved highest = resolve(high, bounds, why);
  if (above(number, highest.value)) {
    throw Refused{joined({view.shown(value), " is above ", highest.text, highest.why}), {}};
  }
}

Number integer_of(DocumentView& view, DocNode value) {
  std::int64_t integer = 0;
  bool negative = false;
  if (!view.as_int(value, integer, negative)) return Number{0, negative ? -1 : 1};
  return Number{static_cast<long double>(integer), 0};
}

}  // namespace

std::string field_path(const std::string& start, const std::vector<PathPart>& innermost_first) {
  std::string text = start;
  for (auto part = innermost_first.rbegin(); part != innermost_first.rend(); ++part) {
    if (part->index) {
      text.append("[").append(part->text).append("]");
    } else {
      if (!text.empty()) text.append(".");
      text.append(part->text);
    }
  }
  return text;
}

std::string grouped(WideCount value) {
  std::string reversed;
  for (int digit = 0; digit == 0 || value != 0; ++digit) {
    if (digit > 0 && digit % 3 == 0) reversed.push_back(',');
    reversed.push_back(static_cast<char>('0' + static_cast<int>(value % 10)));
    value /= 10;
  }
  return std::string(reversed.rbegin(), reversed.rend());
}

std::string grouped(std::int64_t value) {
  if (value >= 0) return grouped(static_cast<WideCount>(value));
  std::string text = "-";
  text.append(grouped(static_cast<WideCount>(-(value + 1)) + 1));
  return text;
}

std::string real_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char buffer[64];
  const auto written = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  std::string_view text(buffer, static_cast<std::size_t>(written.ptr - buffer));  // [-]d[.ddd]e[+-]XX
  std::string out = text.front() == '-' ? "-" : "";
  if (text.front() == '-') text.remove_prefix(1);
  const std::size_t e = text.find('e');
  std::string digits;
  for (const char c : text.substr(0, e)) {
    if (c != '.') digits.push_back(c);
  }
  const int exponent = std::atoi(std::string(text.substr(e + 1)).c_str());
  const int point = exponent + 1;  // digits before the decimal point
  const auto count = static_cast<int>(digits.size());
  if (point <= -4 || point > 16) {  // Python's repr: an exponent outside [1e-4, 1e16)
    out.append(digits, 0, 1);
    if (count > 1) out.append(".").append(digits, 1);
    out.append(exponent < 0 ? "e-" : "e+");
    const int magnitude = std::abs(exponent);
    if (magnitude < 10) out.append("0");
    out.append(std::to_string(magnitude));
  } else if (point <= 0) {
    out.append("0.").append(static_cast<std::size_t>(-point), '0').append(digits);
  } else if (point >= count) {
    out.append(digits).append(static_cast<std::size_t>(point - count), '0').append(".0");
  } else {
    out.append(digits, 0, static_cast<std::size_t>(point)).append(".").append(digits, static_cast<std::size_t>(point));
  }
  return out;
}

Refused wrong_kind(DocumentView& view, std::string_view expected, DocNode value) {
  return Refused{joined({"expected ", expected, ", got ", view.described(value)}), {}};
}

IntSpec::IntSpec(Bound low, Bound high, std::string why)
    : low_(std::move(low)), high_(std::move(high)), why_(std::move(why)),
      fixed_(low_.ref_index < 0 && high_.ref_index < 0) {}

void IntSpec::walk(DocumentView& view, DocNode value, Bounds bounds) const {
  if (view.kind(value) != DocKind::kInt) throw wrong_kind(view, "an integer", value);
  std::int64_t integer = 0;
  bool negative = false;
  const bool fits = view.as_int(value, integer, negative);
  if (fixed_ && fits && low_.integer <= integer && integer <= high_.integer) return;
  const Number number = fits ? Number{static_cast<long double>(integer), 0} : Number{0, negative ? -1 : 1};
  check_range(view, value, number, low_, high_, bounds, why_);
}

NumberSpec::NumberSpec(Bound low, Bound high, std::string why)
    : low_(std::move(low)), high_(std::move(high)), why_(std::move(why)) {}

void NumberSpec::walk(DocumentView& view, DocNode value, Bounds bounds) const {
  const DocKind kind = view.kind(value);
  Number number;
  if (kind == DocKind::kFloat) {
    const double real = view.as_float(value);
    if (!std::isfinite(real)) throw Refused{joined({view.shown(value), " is not a finite number"}), {}};
    number.value = static_cast<long double>(real);
  } else if (kind == DocKind::kInt) {
    number = integer_of(view, value);
  } else {
    throw wrong_kind(view, "a number", value);
  }
  check_range(view, value, number, low_, high_, bounds, why_);
}

void BoolSpec::walk(DocumentView& view, DocNode value, Bounds) const {
  if (view.kind(value) != DocKind::kBool) throw wrong_kind(view, "true or false", value);
}

namespace {

// Whether `text` is UTF-8 as the planner can keep and Python can give back: no surrogate code
// points (a lone one reaches a view encoded as written), no overlong forms, nothing past U+10FFFF.
bool is_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const std::size_t length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    if (length == 0 || i + length > text.size()) return false;
    std::uint32_t code = length == 1 ? lead : lead & (0x7Fu >> length);
    for (std::size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next >> 6) != 0x2) return false;
      code = (code << 6) | (next & 0x3Fu);
    }
    constexpr std::uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < kSmallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += length;
  }
  return true;
}

}  // namespace

void TextSpec::walk(DocumentView& view, DocNode value, Bounds) const {
  if (view.kind(value) != DocKind::kStr) throw wrong_kind(view, "a string", value);
  std::size_t characters = 0;
  if (!is_utf8(view.as_str(value, characters))) {
    throw Refused{"a string that is not text: it holds a lone surrogate (U+D800 to U+DFFF) or bytes that are not UTF-8",
                  {}};
  }
  if (characters > max_chars_) {
    throw Refused{joined({"a string of ", grouped(static_cast<std::int64_t>(characters)), " characters is above ",
                          grouped(static_cast<std::int64_t>(max_chars_))}),
                  {}};
  }
}

ChoiceSpec::ChoiceSpec(std::vector<std::string> names) : names_(std::move(names)) {
  for (const std::string& name : names_) {
    if (!listed_.empty()) listed_.append(", ");
    listed_.append("'").append(name).append("'");
  }
}

void ChoiceSpec::walk(DocumentView& view, DocNode value, Bounds) const {
  if (view.kind(value) == DocKind::kStr) {
    std::size_t characters = 0;
    const std::string_view text = view.as_str(value, characters);
    for (const std::string& name : names_) {
      if (text == name) return;
    }
  }
  throw Refused{joined({view.shown(value), " is not one of ", listed_}), {}};
}

ListSpec::ListSpec(SpecPtr item, Bound max_items, std::size_t min_items)
    : item_(std::move(item)), max_items_(std::move(max_items)), min_items_(min_items) {}

void ListSpec::walk(DocumentView& view, DocNode value, Bounds bounds) const {
  if (view.kind(value) != DocKind::kList) throw wrong_kind(view, "a list", value);
  const std::size_t count = view.length(value);
  const Resolved most = resolve(max_items_, bounds);
  const auto items = static_cast<std::int64_t>(count);
  if (static_cast<long double>(count) > most.value) {
    throw Refused{joined({"a list of ", grouped(items), " items is above ",
                          grouped(static_cast<std::int64_t>(most.value)), most.why}),
                  {}};
  }
  if (count < min_items_) {
    throw Refused{joined({"a list of ", grouped(items), " items is below ",
                          grouped(static_cast<std::int64_t>(min_items_))}),
                  {}};
  }
  const Spec& item = *item_;
  std::size_t index = 0;
  try {
    for (; index < count; ++index) item.walk(view, view.item(value, index), bounds);
  } catch (Refused& refused) {
    refused.path.push_back(at_index(index));
    throw;
  }
}

void RowSpec::walk(DocumentView& view, DocNode value, Bounds bounds) const {
  if (view.kind(value) != DocKind::kList || view.length(value) != items_.size()) {
    throw Refused{joined({"expected a list of ", std::to_string(items_.size()), " items, got ", view.shown(value)}),
                  {}};
  }
  std::size_t index = 0;
  try {
    for (; index < items_.size(); ++index) items_[index]->walk(view, view.item(value, index), bounds);
  } catch (Refused& refused) {
    refused.path.push_back(at_index(index));
    throw;
  }
}

RecordSpec::RecordSpec(Fields required, Fields optional)
    : fields_(std::move(required)), required_(fields_.size()) {
  for (auto& field : optional) fields_.push_back(std::move(field));
  for (const auto& field : fields_) {
    if (!listed_.empty()) listed_.append(", ");
    listed_.append(field.first);
  }
}

const std::pair<std::string, SpecPtr>* RecordSpec::field_named(std::string_view name) const {
  for (const auto& field : fields_) {
    if (field.first == name) return &field;
  }
  return nullptr;
}

void RecordSpec::walk(DocumentView& view, DocNode value, Bounds bounds) const {
  if (view.kind(value) != DocKind::kDict) throw wrong_kind(view, "an object", value);
  std::size_t cursor = 0;
  DocNode key = nullptr;
  DocNode item = nullptr;
  while (view.next_field(value, cursor, key, item)) {
    const std::pair<std::string, SpecPtr>* matched = nullptr;
    std::string name;
    if (view.kind(key) == DocKind::kStr) {
      std::size_t characters = 0;
      name = view.as_str(key, characters);
      matched = field_named(name);
    }
    if (matched == nullptr) {
      throw Refused{joined({"unknown field ", view.shown(key), " (fields: ", listed_, ")"}), {}};
    }
    try {
      matched->second->walk(view, item, bounds);
    } catch (Refused& refused) {
      refused.path.push_back(at_name(name));  // as the document names it
      throw;
    }
  }
  if (view.length(value) < fields_.size()) {
    for (std::size_t i = 0; i < required_; ++i) {
      if (view.field(value, fields_[i].first) == nullptr) {
        throw Refused{joined({"missing field '", fields_[i].first, "'"}), {}};
      }
    }
  }
}

std::optional<Refusal> check(DocumentView& view, DocNode value, const Spec& spec, Bounds bounds,
                             const std::string& field) {
  try {
    spec.walk(view, value, bounds);
  } catch (Refused& refused) {
    return Refusal{field_path(field, refused.path), std::move(refused.problem)};
  }
  return std::nullopt;
}

Refusal refuse(const std::string& start, std::vector<PathPart> outermost_first, std::string problem) {
  const std::vector<PathPart> innermost_first(outermost_first.rbegin(), outermost_first.rend());
  return Refusal{field_path(start, innermost_first), std::move(problem)};
}

}  // namespace stowage::planner
