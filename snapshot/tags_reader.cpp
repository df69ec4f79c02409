#include "snapshot/tags_reader.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "snapshot/categories.hpp"
#include "snapshot/names.hpp"
#include "snapshot/recompute_estimate.hpp"
#include "snapshot/refusal.hpp"

namespace stowage::snapshot {

namespace {

// `text` cut to its first `most` characters (code points of UTF-8, lone surrogates as written).
std::string first_characters(std::string text, std::size_t most) {
  std::size_t characters = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80 && characters++ == most) {
      text.resize(i);
      break;
    }
  }
  return text;
}

class TagsReader {
 public:
  TagsReader(Objects& objects, std::string where) : objects_(objects), where_(std::move(where)) {}

  std::string kind_name(Handle value) {
    const Kind kind = objects_.kind_of(value);
    return kind == Kind::kOther ? objects_.other_type_name(value) : type_name(kind);
  }

  // dict.get(key): the value, or nullptr where absent or None.
  Handle get(Handle dict, std::string_view key) {
    std::vector<Handle> children;  // its keys, then its values
    for (std::size_t cursor = 0; objects_.children(dict, cursor, 64, children);) {
    }
    const std::size_t count = children.size() / 2;
    for (std::size_t k = 0; k < count; ++k) {
      if (objects_.kind_of(children[k]) == Kind::kStr && objects_.utf8_of(children[k]) == key) {
        return objects_.kind_of(children[count + k]) == Kind::kNone ? nullptr : children[count + k];
      }
    }
    return nullptr;
  }

  bool is_one(Handle value) {
    if (value == nullptr) return false;
    bool fits = false;
    switch (objects_.kind_of(value)) {
      case Kind::kBool:
      case Kind::kInt: return objects_.int_of(value, fits) == 1 && fits;
      case Kind::kFloat: return objects_.float_of(value) == 1.0;
      default: return false;
    }
  }

  // A list of integers each in [low, high), the first that is not named.
  std::vector<std::int64_t> integers(Handle value, const std::string& field, std::int64_t low, std::int64_t high) {
    const std::string where = where_ + "." + field;
    if (value == nullptr || objects_.kind_of(value) != Kind::kList) {
      SNAPSHOT_REFUSE(where, ": expected a list, got ", value == nullptr ? "NoneType" : kind_name(value));
    }
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < objects_.length(value); ++i) {
      const Handle item = objects_.item(value, i);
      bool fits = false;
      const std::int64_t number = objects_.kind_of(item) == Kind::kInt ? objects_.int_of(item, fits) : 0;
      if (!fits || number < low || number >= high) {
        SNAPSHOT_REFUSE(where, "[", i, "]: expected an integer in [", low, ", ", high, "), got ",
                        first_characters(objects_.repr(item), 40));
      }
      out.push_back(number);
    }
    return out;
  }

  // Each item of the list `value` as `read` makes it (none: an item that does not fit), or a refusal
  // naming `field` and what it `expects` where `value` is no such list (or an empty one, `nonempty`).
  template <typename Read>
  auto items(Handle value, const char* field, const std::string& expects, bool nonempty, Read read) {
    std::vector<typename std::invoke_result_t<Read, Handle>::value_type> out;
    const bool listed = value != nullptr && objects_.kind_of(value) == Kind::kList;
    for (std::size_t i = 0; listed && i < objects_.length(value); ++i) {
      auto item = read(objects_.item(value, i));
      if (!item) break;
      out.push_back(std::move(*item));
    }
    if (!listed || (nonempty && out.empty()) || out.size() != objects_.length(value)) {
      SNAPSHOT_REFUSE(where_, ".", field, ": expected ", expects);
    }
    return out;
  }

  // The categories' numbers as kCategoryNames', and -1's (no hook saw it: temporaries) last.
  std::vector<std::int8_t> numbering(Handle names) {
    std::string all;
    for (const char* name : kCategoryNames) all += (all.empty() ? "" : ", ") + std::string(name);
    std::vector<std::int8_t> out = items(names, "categories", "a list of " + all, false, [&](Handle name) {
      const std::string text = objects_.kind_of(name) == Kind::kStr ? objects_.utf8_of(name) : std::string();
      for (std::size_t k = 0; k < std::size(kCategoryNames); ++k) {
        if (objects_.kind_of(name) == Kind::kStr && text == kCategoryNames[k]) return std::optional(static_cast<std::int8_t>(k));
      }
      return std::optional<std::int8_t>();
    });
    out.push_back(static_cast<std::int8_t>(Category::kTemporaries));
    return out;
  }

  std::vector<std::string> paths(Handle modules) {
    return items(modules, "modules", "a non-empty list of strings", true, [&](Handle path) {
      if (objects_.kind_of(path) != Kind::kStr) return std::optional<std::string>();
      return std::optional(first_characters(objects_.utf8_of(path), kMaxPath));
    });
  }

  const std::string& where() const { return where_; }

 private:
  Objects& objects_;
  std::string where_;
};

}  // namespace

std::optional<ExactTags> read_tags(Objects& objects, Handle tags, std::int64_t device,
                                   std::span<const std::uint8_t> action) {
  TagsReader top(objects, "stowage_tags");
  if (tags == nullptr || objects.kind_of(tags) == Kind::kNone) return std::nullopt;
  if (objects.kind_of(tags) != Kind::kDict) SNAPSHOT_REFUSE(top.where(), ": expected a dict, got ", top.kind_name(tags));
  const Handle found = top.get(tags, std::to_string(device));
  if (found == nullptr) return std::nullopt;
  TagsReader reader(objects, top.where() + "." + std::to_string(device));
  if (objects.kind_of(found) != Kind::kDict || !reader.is_one(reader.get(found, "format"))) {
    SNAPSHOT_REFUSE(reader.where(), ": expected a dict of format 1");
  }
  const std::vector<std::int8_t> numbering = reader.numbering(reader.get(found, "categories"));
  ExactTags out;
  out.paths = reader.paths(reader.get(found, "modules"));
  const auto count = [](std::size_t n) { return static_cast<std::int64_t>(n); };
  out.events = reader.integers(reader.get(found, "events"), "events", 0, count(action.size()));
  const std::vector<std::int64_t> category =
      reader.integers(reader.get(found, "category"), "category", -1, count(numbering.size() - 1));
  out.module = reader.integers(reader.get(found, "module"), "module", 0, count(out.paths.size()));
  if (out.events.size() != category.size() || category.size() != out.module.size()) {
    SNAPSHOT_REFUSE(reader.where(), ": events, category and module differ in length (", out.events.size(), ", ",
                    category.size(), ", ", out.module.size(), ")");
  }
  const std::uint8_t alloc = *action_code(Name::kAlloc);
  for (std::size_t i = 0; i < out.events.size(); ++i) {
    if (action[static_cast<std::size_t>(out.events[i])] != alloc) {
      SNAPSHOT_REFUSE(reader.where(), ".events[", i, "]: event ", out.events[i], " is not an allocation");
    }
  }
  for (const std::int64_t c : category) out.category.push_back(numbering[static_cast<std::size_t>(c < 0 ? count(numbering.size()) - 1 : c)]);
  PathBlocks blocks = block_of_paths(out.paths);
  out.block_of_path = std::move(blocks.block_of_path);
  out.blocks = std::move(blocks.blocks);
  return out;
}

}  // namespace stowage::snapshot
