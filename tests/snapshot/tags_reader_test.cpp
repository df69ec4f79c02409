// snapshot/tags_reader: stowage's tags read from a snapshot's objects (TreeObjects), resolved to
// kCategoryNames' numbering and the model's blocks; each field that does not fit refused by name.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "snapshot/categories.hpp"
#include "snapshot/names.hpp"
#include "snapshot/refusal.hpp"
#include "snapshot/tags_reader.hpp"
#include "tests/snapshot/tree_objects.hpp"

namespace stowage::snapshot {
namespace {

class TagsReaderTest : public ::testing::Test {
 protected:
  Handle str(const std::string& text) { return objects_.make_str(text); }
  Handle ints(const std::vector<std::int64_t>& values) {
    std::vector<Handle> items;
    for (const std::int64_t value : values) items.push_back(objects_.make_int(value));
    return objects_.make_list(items);
  }
  Handle strs(const std::vector<std::string>& values) {
    std::vector<Handle> items;
    for (const std::string& value : values) items.push_back(str(value));
    return objects_.make_list(items);
  }
  // {"0": {...}} with the fields below, `change` applied to the device's dict first.
  Handle tags(const std::function<void(Handle)>& change = {}) {
    const Handle device = objects_.make_dict();
    objects_.set_item(device, str("format"), objects_.make_int(1));
    objects_.set_item(device, str("categories"), strs({"parameters", "activations"}));
    objects_.set_item(device, str("modules"), strs({"M", "M.h", "M.h.0", "M.h.0.x"}));
    objects_.set_item(device, str("events"), ints({0, 2}));
    objects_.set_item(device, str("category"), ints({1, -1}));
    objects_.set_item(device, str("module"), ints({3, 0}));
    if (change) change(device);
    const Handle all = objects_.make_dict();
    objects_.set_item(all, str("0"), device);
    return all;
  }
  std::string refusal(Handle all) {
    try {
      read_tags(objects_, all, 0, action_);
    } catch (const Refused& error) {
      return error.message();
    }
    return "";
  }

  testing::TreeObjects objects_;
  const std::vector<std::uint8_t> action_{*action_code(Name::kAlloc), *action_code(Name::kFreeCompleted),
                                          *action_code(Name::kAlloc)};
};

TEST_F(TagsReaderTest, ReadsCategoriesModulesAndBlocks) {
  const auto found = read_tags(objects_, tags(), 0, action_);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->events, (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(found->category, (std::vector<std::int8_t>{static_cast<std::int8_t>(Category::kActivations),
                                                        static_cast<std::int8_t>(Category::kTemporaries)}));
  EXPECT_EQ(found->module, (std::vector<std::int64_t>{3, 0}));
  EXPECT_EQ(found->blocks, (std::vector<std::string>{"M.h.0"}));
  EXPECT_EQ(found->block_of_path, (std::vector<std::int64_t>{-1, -1, 0, 0}));
  EXPECT_FALSE(read_tags(objects_, tags(), 1, action_).has_value());  // none for device 1
  EXPECT_FALSE(read_tags(objects_, nullptr, 0, action_).has_value());
}

TEST_F(TagsReaderTest, EachFieldThatDoesNotFitIsRefusedByName) {
  const auto with = [&](const char* field, Handle value) {
    return tags([&](Handle device) { objects_.set_item(device, str(field), value); });
  };
  EXPECT_EQ(refusal(str("x")), "stowage_tags: expected a dict, got str");
  EXPECT_EQ(refusal(with("format", objects_.make_int(2))), "stowage_tags.0: expected a dict of format 1");
  EXPECT_EQ(refusal(with("categories", strs({"weights"}))).rfind("stowage_tags.0.categories: expected a list of parameters, ", 0), 0U);
  EXPECT_EQ(refusal(with("modules", strs({}))), "stowage_tags.0.modules: expected a non-empty list of strings");
  EXPECT_EQ(refusal(with("events", ints({0, 3}))), "stowage_tags.0.events[1]: expected an integer in [0, 3), got 3");
  EXPECT_EQ(refusal(with("events", str("x"))), "stowage_tags.0.events: expected a list, got str");
  EXPECT_EQ(refusal(with("category", ints({2, 0}))), "stowage_tags.0.category[0]: expected an integer in [-1, 2), got 2");
  EXPECT_EQ(refusal(with("module", ints({0}))), "stowage_tags.0: events, category and module differ in length (2, 2, 1)");
  EXPECT_EQ(refusal(with("events", ints({1, 2}))), "stowage_tags.0.events[0]: event 1 is not an allocation");
}

}  // namespace
}  // namespace stowage::snapshot
