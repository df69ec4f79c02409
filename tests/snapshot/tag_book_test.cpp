// TagBook: module paths and owners as named, and forgetting that leaves every allocation the
// history still holds resolved as without it (random recordings, checked after every step).
#include "snapshot/tag_book.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "base/errors.hpp"

namespace stowage {
namespace {

constexpr std::int64_t kCategories = 5;

std::vector<std::string> module_names(const TagBook& book, const ResolvedTags& tags) {
  std::vector<std::string> names;
  for (const std::int64_t id : tags.module) names.push_back(book.paths()[static_cast<std::size_t>(id)]);
  return names;
}

TEST(TagBook, ASpanWithoutAPathIsNamedAfterItsEnclosingOne) {
  TagBook book(100);
  book.enter(0, "Net", "Net");
  book.enter(1, std::nullopt, "ReLU");
  EXPECT_FALSE(book.leave(3));
  book.enter(4, "Net.0", "Linear");
  EXPECT_FALSE(book.leave(5));
  EXPECT_TRUE(book.leave(6));
  EXPECT_FALSE(book.in_forward());
  EXPECT_EQ(book.paths(), (std::vector<std::string>{"", "Net", "Net.ReLU", "Net.0"}));
  const ResolvedTags tags = book.resolve({2, 4, 7}, {10, 11, 12}, kCategories);
  EXPECT_EQ(tags.allocation, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(module_names(book, tags), (std::vector<std::string>{"Net.ReLU", "Net.0"}));
  EXPECT_THROW(book.leave(8), LogicError);
}

TEST(TagBook, AKeyIsOwnedByTheFirstModuleListingItAndNotesNameIt) {
  TagBook book(100);
  book.own({"Net", "Net.0", "Net.1"}, {{}, {1, 2}, {2, 3}});  // 2 is shared: Net.0 lists it first
  book.note(5, {100, 200, 300, 400}, 0, {1, 2, 3, 99});
  const ResolvedTags tags = book.resolve({1, 2, 3, 4}, {100, 200, 300, 400}, kCategories);
  EXPECT_EQ(tags.allocation, (std::vector<std::int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(tags.category, (std::vector<std::int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(module_names(book, tags), (std::vector<std::string>{"Net.0", "Net.0", "Net.1", ""}));
  EXPECT_EQ(book.paths(), (std::vector<std::string>{"", "Net", "Net.0", "Net.1"}));  // in order of sight
}

// A recording: allocations at positions 0, 1, ... (few addresses, so they are reused), spans
// opened and closed, and notes between them; `bounded` forgets, `whole` keeps everything. Every
// allocation the history still holds (the newest max_entries) resolves alike in both.
TEST(TagBook, ForgettingLeavesTheHistoryHeldResolvedAsBefore) {
  std::mt19937_64 random(20261129);
  for (int trial = 0; trial < 40; ++trial) {
    const std::int64_t max_entries = std::uniform_int_distribution<std::int64_t>(0, 40)(random);
    TagBook bounded(max_entries);
    TagBook whole(1 << 30);
    std::vector<std::int64_t> positions;
    std::vector<std::uint64_t> addresses;
    for (TagBook* book : {&bounded, &whole}) book->own({"M", "M.a", "M.b"}, {{1}, {2}, {3}});
    for (int step = 0; step < 3000; ++step) {
      const auto at = static_cast<std::int64_t>(positions.size());
      const int what = std::uniform_int_distribution<int>(0, 9)(random);
      if (what == 0 && (!bounded.in_forward() || at % 3)) {
        const std::optional<std::string> path =
            at % 2 ? std::optional<std::string>("M." + std::to_string(at % 7)) : std::nullopt;
        for (TagBook* book : {&bounded, &whole}) book->enter(at, path, "T" + std::to_string(at % 5));
      } else if (what == 1 && bounded.in_forward()) {
        EXPECT_EQ(bounded.leave(at), whole.leave(at));
      } else if (what < 6) {
        const std::uint64_t address = std::uniform_int_distribution<std::uint64_t>(0, 7)(random);
        const std::int64_t category = std::uniform_int_distribution<std::int64_t>(0, kCategories - 1)(random);
        const std::uint64_t owner = std::uniform_int_distribution<std::uint64_t>(0, 4)(random);
        for (TagBook* book : {&bounded, &whole}) book->note(at, {address}, category, {owner});
      } else {
        positions.push_back(at);
        addresses.push_back(std::uniform_int_distribution<std::uint64_t>(0, 7)(random));
      }
      ASSERT_EQ(bounded.in_forward(), whole.in_forward());
      ASSERT_LE(static_cast<std::int64_t>(bounded.notes().size()), 4 * max_entries + 1025);
      ASSERT_LE(static_cast<std::int64_t>(bounded.spans().size()), 4 * max_entries + 1025);
      for (std::size_t s = 0; s < bounded.spans().size(); ++s) {  // parents come first and enclose
        const ModuleSpan& span = bounded.spans()[s];
        ASSERT_LT(span[3], static_cast<std::int64_t>(s));
        if (span[3] >= 0) {
          ASSERT_LE(bounded.spans()[static_cast<std::size_t>(span[3])][0], span[0]);
        }
      }
    }
    const auto held_from = static_cast<std::ptrdiff_t>(
        std::max<std::int64_t>(0, static_cast<std::int64_t>(positions.size()) - max_entries));
    const std::vector<std::int64_t> held(positions.begin() + held_from, positions.end());
    const std::vector<std::uint64_t> held_addresses(addresses.begin() + held_from, addresses.end());
    const ResolvedTags got = bounded.resolve(held, held_addresses, kCategories);
    const ResolvedTags want = whole.resolve(held, held_addresses, kCategories);
    SCOPED_TRACE(trial);
    EXPECT_EQ(got.allocation, want.allocation);
    EXPECT_EQ(got.category, want.category);
    EXPECT_EQ(module_names(bounded, got), module_names(whole, want));
  }
}

}  // namespace
}  // namespace stowage
