// JsonDocument: a small JSON document for the schema tests, parsed from text (NaN and Infinity
// as json.loads reads them; integers beyond 64 bits kept by their sign and digits) or built a node
// at a time, read through planner::DocumentView as stowage._core reads Python's objects. Values
// are quoted as stowage.validation.errors.shown quotes them, for the kinds JSON has.
//
// Contract: nodes live in a deque (stable addresses, no recursion to free a deep document); the
// parser recurses once per level of nesting, for the tests' small documents only.
#pragma once

#include <cctype>
#include <cmath>
#include <cstdint>
#include <deque>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "planner/document.hpp"
#include "planner/schema.hpp"

namespace stowage::planner::testing {

struct JsonNode {
  DocKind kind = DocKind::kNull;
  bool boolean = false;
  std::int64_t integer = 0;
  bool big = false;  // an integer beyond 64 bits: `text` its digits, `boolean` its sign (true: negative)
  double real = 0;
  std::string text;
  std::vector<const JsonNode*> items;  // a list's items, or an object's keys and values in turn
};

class JsonDocument final : public DocumentView {
 public:
  explicit JsonDocument(std::string_view text) : text_(text) { root_ = parse(); }
  JsonDocument() = default;

  const JsonNode* root() const { return root_; }
  JsonNode* add(JsonNode node) { return &nodes_.emplace_back(std::move(node)); }

  DocKind kind(DocNode node) override { return of(node).kind; }
  bool as_bool(DocNode node) override { return of(node).boolean; }
  bool as_int(DocNode node, std::int64_t& value, bool& negative) override {
    value = of(node).integer;
    negative = of(node).big && of(node).boolean;
    return !of(node).big;
  }
  double as_float(DocNode node) override { return of(node).real; }
  std::string_view as_str(DocNode node, std::size_t& characters) override {
    characters = 0;
    for (const char c : of(node).text) characters += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
    return of(node).text;
  }
  std::size_t length(DocNode node) override {
    return of(node).kind == DocKind::kDict ? of(node).items.size() / 2 : of(node).items.size();
  }
  DocNode item(DocNode list, std::size_t index) override { return of(list).items[index]; }
  bool next_field(DocNode dict, std::size_t& cursor, DocNode& key, DocNode& value) override {
    if (2 * cursor >= of(dict).items.size()) return false;
    key = of(dict).items[2 * cursor];
    value = of(dict).items[2 * cursor + 1];
    ++cursor;
    return true;
  }
  DocNode field(DocNode dict, std::string_view key) override {
    for (std::size_t i = 0; i < of(dict).items.size(); i += 2) {
      if (of(dict).items[i]->text == key) return of(dict).items[i + 1];
    }
    return nullptr;
  }
  bool equals(DocNode node, std::string_view text) override {
    return of(node).kind == DocKind::kStr && of(node).text == text;
  }
  bool equals(DocNode node, std::int64_t integer) override {  // as Python: 1.0 and true equal 1
    const JsonNode& value = of(node);
    if (value.kind == DocKind::kInt) return !value.big && value.integer == integer;
    if (value.kind == DocKind::kBool) return (value.boolean ? 1 : 0) == integer;
    return value.kind == DocKind::kFloat && value.real == static_cast<double>(integer);
  }
  std::string path_text(DocNode key, bool& index) override {
    index = of(key).kind == DocKind::kInt;
    return shown(key);
  }
  std::string shown(DocNode node) override {
    const JsonNode& value = of(node);
    switch (value.kind) {
      case DocKind::kNull: return "null";
      case DocKind::kBool: return value.boolean ? "true" : "false";
      case DocKind::kInt: return value.big ? value.text : std::to_string(value.integer);
      case DocKind::kFloat: return real_text(value.real);
      case DocKind::kStr: {
        std::string quoted = "'";
        quoted.append(value.text, 0, 60).append(value.text.size() <= 60 ? "" : "...").append("'");
        return quoted;
      }
      case DocKind::kList:
        return std::string("a list of ").append(grouped(static_cast<std::int64_t>(value.items.size()))).append(" items");
      case DocKind::kDict:
        return std::string("an object of ")
            .append(grouped(static_cast<std::int64_t>(value.items.size() / 2)))
            .append(" fields");
      default: return "a value";
    }
  }
  std::string described(DocNode node) override {
    static const char* const names[] = {"null", "a boolean", "an integer", "a number", "a string", "a list", "an object"};
    const DocKind kind = of(node).kind;
    std::string text = names[static_cast<int>(kind)];
    if (kind != DocKind::kNull && kind != DocKind::kList && kind != DocKind::kDict) {
      text.append(" (").append(shown(node)).append(")");
    }
    return text;
  }

 private:
  static const JsonNode& of(DocNode node) { return *static_cast<const JsonNode*>(node); }

  void skip() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_])) != 0) ++at_;
  }
  bool take(std::string_view word) {
    skip();
    if (text_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }
  std::string string_body() {
    std::string out;
    ++at_;  // the opening quote; escapes: \" and \\ only
    while (text_.at(at_) != '"') {
      if (text_[at_] == '\\') ++at_;
      out.push_back(text_[at_++]);
    }
    ++at_;
    return out;
  }
  const JsonNode* parse() {
    JsonNode node;
    skip();
    if (take("null")) return add(node);
    if (take("true") || take("false")) {
      node.kind = DocKind::kBool;
      node.boolean = text_[at_ - 1] == 'e' && text_[at_ - 2] == 'u';
      return add(node);
    }
    if (take("NaN")) return add(JsonNode{DocKind::kFloat, false, 0, false, NAN, {}, {}});
    if (take("Infinity")) return add(JsonNode{DocKind::kFloat, false, 0, false, INFINITY, {}, {}});
    if (text_.at(at_) == '"') {
      node.kind = DocKind::kStr;
      node.text = string_body();
      return add(node);
    }
    if (take("[")) {
      node.kind = DocKind::kList;
      while (!take("]")) {
        node.items.push_back(parse());
        take(",");
      }
      return add(node);
    }
    if (take("{")) {
      node.kind = DocKind::kDict;
      while (!take("}")) {
        skip();
        node.items.push_back(parse());
        take(":");
        node.items.push_back(parse());
        take(",");
      }
      return add(node);
    }
    const std::size_t start = at_;
    while (at_ < text_.size() && std::string_view("+-0123456789.eE").find(text_[at_]) != std::string_view::npos) ++at_;
    const std::string number(text_.substr(start, at_ - start));
    if (number.find_first_of(".eE") != std::string::npos) {
      node.kind = DocKind::kFloat;
      node.real = std::stod(number);
    } else {
      node.kind = DocKind::kInt;
      node.big = number.size() > 18;
      node.boolean = number.front() == '-';
      node.text = number;
      if (!node.big) node.integer = std::stoll(number);
    }
    return add(node);
  }

  std::deque<JsonNode> nodes_;
  std::string text_;
  std::size_t at_ = 0;
  const JsonNode* root_ = nullptr;
};

}  // namespace stowage::planner::testing
