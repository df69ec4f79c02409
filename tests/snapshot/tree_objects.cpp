#include "tests/snapshot/tree_objects.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace stowage::snapshot::testing {

namespace {

bool is_number(Kind kind) { return kind == Kind::kBool || kind == Kind::kInt || kind == Kind::kFloat; }

Node with(Kind kind, std::int64_t integer = 0, double real = 0.0, std::string_view text = {},
          std::span<const Handle> items = {}) {
  Node made;
  made.kind = kind;
  made.integer = integer;
  made.real = real;
  made.text = std::string(text);
  made.items.assign(items.begin(), items.end());
  return made;
}

std::string shown_float(double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

}  // namespace

TreeObjects::~TreeObjects() {
  for (Node* node : nodes_) delete node;
}

Handle TreeObjects::make(Node node) {
  node.references = 1;
  nodes_.push_back(new Node(std::move(node)));
  return nodes_.back();
}

const Node& TreeObjects::held(Handle object) const {
  const Node* found = static_cast<const Node*>(object);
  if (object == nullptr || found->references <= 0) throw std::logic_error("an object no one holds was used");
  return *found;
}

Node& TreeObjects::held(Handle object) {
  return const_cast<Node&>(static_cast<const TreeObjects*>(this)->held(object));
}

const Node& TreeObjects::node(Handle object) const { return held(object); }

Handle TreeObjects::make_none() { return make(with(Kind::kNone)); }
Handle TreeObjects::make_bool(bool value) { return make(with(Kind::kBool, value ? 1 : 0)); }
Handle TreeObjects::make_int(std::int64_t value) { return make(with(Kind::kInt, value)); }
Handle TreeObjects::make_float(double value) { return make(with(Kind::kFloat, 0, value)); }
Handle TreeObjects::make_str(std::string_view utf8) { return make(with(Kind::kStr, 0, 0.0, utf8)); }

Handle TreeObjects::make_ascii(std::string_view ascii) {
  for (const char c : ascii) {
    if (static_cast<unsigned char>(c) > 0x7f) throw BadPickle("'ascii' codec can't decode");
  }
  return make_str(ascii);
}

Handle TreeObjects::make_bytes(std::string_view bytes) { return make(with(Kind::kBytes, 0, 0.0, bytes)); }

Handle TreeObjects::make_list(std::span<const Handle> items) {
  for (const Handle item : items) retain(item);
  return make(with(Kind::kList, 0, 0.0, {}, items));
}

Handle TreeObjects::make_dict() { return make(with(Kind::kDict)); }

Handle TreeObjects::make_tuple(std::span<const Handle> items) {
  for (const Handle item : items) retain(item);
  return make(with(Kind::kTuple, 0, 0.0, {}, items));
}

void TreeObjects::extend(Handle list, std::span<const Handle> items) {
  Node& target = held(list);
  for (const Handle item : items) {
    retain(item);
    target.items.push_back(item);
  }
}

void TreeObjects::set_item(Handle dict, Handle key, Handle value) {
  Node& target = held(dict);
  const Kind kind = held(key).kind;
  if (kind == Kind::kList || kind == Kind::kDict) throw BadPickle("unhashable type");
  retain(value);
  for (std::size_t i = 0; i < target.items.size(); i += 2) {
    if (equal(target.items[i], key)) {
      release(target.items[i + 1]);
      target.items[i + 1] = value;
      return;
    }
  }
  retain(key);
  target.items.push_back(key);
  target.items.push_back(value);
}

void TreeObjects::retain(Handle object) { ++held(object).references; }

void TreeObjects::release(Handle object) {
  Node& node = held(object);
  if (--node.references > 0) return;
  for (const Handle item : node.items) release(item);
}

TextNumber TreeObjects::parse_int(std::string_view line) {
  TextNumber out;
  const auto [end, error] = std::from_chars(line.data(), line.data() + line.size(), out.integer);
  if (error == std::errc::result_out_of_range) {
    out.fits = false;
    out.shown = std::string(line);
  } else if (error != std::errc() || end != line.data() + line.size()) {
    throw BadPickle("invalid literal for int()");
  }
  return out;
}

TextNumber TreeObjects::parse_float(std::string_view line) {
  TextNumber out;
  const auto [end, error] = std::from_chars(line.data(), line.data() + line.size(), out.real);
  if (error != std::errc() || end != line.data() + line.size()) throw BadPickle("could not convert string to float");
  return out;
}

Handle TreeObjects::make_escaped_ascii(std::string_view quoted_body) {
  if (quoted_body.find('\\') != std::string_view::npos) throw BadPickle("escapes are not read here");
  return make_ascii(quoted_body);
}

Handle TreeObjects::make_raw_unicode_escape(std::string_view line) { return make_escaped_ascii(line); }

std::string TreeObjects::utf8_of(Handle str) { return held(str).text; }

std::string TreeObjects::repr(Handle object) { return show(object); }

std::string TreeObjects::float_repr(double value) { return shown_float(value); }

std::string TreeObjects::long_repr(std::span<const std::uint8_t> little_endian) {
  return "of " + std::to_string(little_endian.size() * 8) + " bits";
}

Kind TreeObjects::kind_of(Handle object) { return held(object).kind; }
bool TreeObjects::shared(Handle object) { return held(object).references > 1; }

// The cursor counts children given: a dict's i-th child is its i-th key, then its (i - n)-th value.
bool TreeObjects::children(Handle container, std::size_t& cursor, std::size_t most, std::vector<Handle>& out) {
  const Node& node = held(container);
  const std::size_t count = node.items.size();
  const std::size_t end = std::min(count, cursor + most);
  const std::size_t keys = count / 2;
  for (std::size_t i = cursor; i < end; ++i) {
    if (node.kind != Kind::kDict) out.push_back(node.items[i]);
    else out.push_back(i < keys ? node.items[2 * i] : node.items[2 * (i - keys) + 1]);
  }
  cursor = end;
  return end < count;
}

std::size_t TreeObjects::length(Handle container) {
  const Node& node = held(container);
  return node.kind == Kind::kDict ? node.items.size() / 2 : node.items.size();
}

Handle TreeObjects::item(Handle container, std::size_t index) { return held(container).items.at(index); }

Handle TreeObjects::find(Handle dict, Name key) {
  const Node& node = held(dict);
  for (std::size_t i = 0; i < node.items.size(); i += 2) {
    const Node& stored = held(node.items[i]);
    if (stored.kind == Kind::kStr && stored.text == text_of(key)) return node.items[i + 1];
  }
  return nullptr;
}

Name TreeObjects::name_of(Handle str) { return snapshot::name_of(held(str).text); }
bool TreeObjects::same_str(Handle a, Handle b) { return held(a).text == held(b).text; }

std::int64_t TreeObjects::int_of(Handle integer, bool& fits) {
  fits = true;
  return held(integer).integer;
}

bool TreeObjects::uint_of(Handle /*integer*/, std::uint64_t& /*value*/) { return false; }
double TreeObjects::float_of(Handle real) { return held(real).real; }
std::string TreeObjects::other_type_name(Handle /*object*/) { return "object"; }

std::size_t TreeObjects::live() const {
  // As Python's collector finds garbage cycles: take off each reference one live object holds to
  // another; what is left is held from outside, and so is what it reaches.
  std::unordered_map<const Node*, int> outside;
  for (const Node* node : nodes_) {
    if (node->references > 0) outside.emplace(node, node->references);
  }
  for (const auto& [node, references] : outside) {
    for (const Handle item : node->items) --outside.at(static_cast<const Node*>(item));
  }
  std::vector<const Node*> reached;
  std::unordered_set<const Node*> seen;
  for (const auto& [node, references] : outside) {
    if (references > 0 && seen.insert(node).second) reached.push_back(node);
  }
  while (!reached.empty()) {
    const Node* node = reached.back();
    reached.pop_back();
    for (const Handle item : node->items) {
      if (seen.insert(static_cast<const Node*>(item)).second) reached.push_back(static_cast<const Node*>(item));
    }
  }
  return seen.size();
}

bool TreeObjects::equal(Handle a, Handle b) const {
  const Node& x = node(a);
  const Node& y = node(b);
  if (is_number(x.kind) && is_number(y.kind)) {
    const double left = x.kind == Kind::kFloat ? x.real : static_cast<double>(x.integer);
    const double right = y.kind == Kind::kFloat ? y.real : static_cast<double>(y.integer);
    return x.kind != Kind::kFloat && y.kind != Kind::kFloat ? x.integer == y.integer : left == right;
  }
  if (x.kind != y.kind) return false;
  if (x.kind == Kind::kNone) return true;
  if (x.kind == Kind::kStr || x.kind == Kind::kBytes) return x.text == y.text;
  if (x.items.size() != y.items.size()) return false;
  for (std::size_t i = 0; i < x.items.size(); ++i) {
    if (!equal(x.items[i], y.items[i])) return false;
  }
  return true;
}

std::string TreeObjects::show(Handle object) const {
  const Node& shown = node(object);
  switch (shown.kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return shown.integer != 0 ? "True" : "False";
    case Kind::kInt: return std::to_string(shown.integer);
    case Kind::kFloat: return shown_float(shown.real);
    case Kind::kStr: return "'" + shown.text + "'";
    case Kind::kBytes: return "b'" + shown.text + "'";
    default: break;
  }
  const bool dict = shown.kind == Kind::kDict;
  std::string out = dict ? "{" : shown.kind == Kind::kTuple ? "(" : "[";
  for (std::size_t i = 0; i < shown.items.size(); ++i) {
    if (i != 0) out += dict && i % 2 == 1 ? ": " : ", ";
    out += show(shown.items[i]);
  }
  return out + (dict ? "}" : shown.kind == Kind::kTuple ? ")" : "]");
}

}  // namespace stowage::snapshot::testing
