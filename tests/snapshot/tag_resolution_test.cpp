// resolve_tags against a brute-force reading of its contract, on hand-made cases and on random
// traces: allocations reusing few addresses, notes before and after them, nested module spans.
#include "snapshot/tag_resolution.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace stowage {
namespace {

constexpr std::int64_t kCategories = 5;

// The contract, read literally: O(allocations x (notes + spans)).
ResolvedTags brute_force(const std::vector<std::int64_t>& positions, const std::vector<std::uint64_t>& addresses,
                         const std::vector<TagNote>& notes, const std::vector<ModuleSpan>& spans) {
  const std::size_t count = positions.size();
  std::vector<std::int64_t> category(count, kCategories);
  std::vector<std::int64_t> module(count, 0);
  for (std::size_t a = 0; a < count; ++a) {
    std::int64_t innermost_begin = -1;
    for (const ModuleSpan& span : spans) {  // nested: the open span that began last is innermost
      const bool open = span[0] <= positions[a] && (span[1] < 0 || span[1] > positions[a]);
      if (open && span[0] >= innermost_begin) {
        innermost_begin = span[0];
        module[a] = span[2];
      }
    }
  }
  for (const TagNote& note : notes) {
    std::int64_t latest = -1;
    for (std::size_t a = 0; a < count; ++a) {
      if (addresses[a] == note.address && positions[a] < std::max<std::int64_t>(note.position, 0) &&
          (latest < 0 || positions[a] > positions[static_cast<std::size_t>(latest)])) {
        latest = static_cast<std::int64_t>(a);
      }
    }
    if (latest >= 0) {
      const auto a = static_cast<std::size_t>(latest);
      category[a] = std::min(category[a], note.category);
      module[a] = note.owner >= 0 ? note.owner : module[a];
    }
  }
  ResolvedTags out;
  for (std::size_t a = 0; a < count; ++a) {
    if (category[a] < kCategories || module[a] > 0) {
      out.allocation.push_back(static_cast<std::int64_t>(a));
      out.category.push_back(category[a] < kCategories ? category[a] : -1);
      out.module.push_back(module[a]);
    }
  }
  return out;
}

void expect_same(const ResolvedTags& got, const ResolvedTags& want) {
  EXPECT_EQ(got.allocation, want.allocation);
  EXPECT_EQ(got.category, want.category);
  EXPECT_EQ(got.module, want.module);
}

TEST(TagResolution, ANoteIsAboutTheLatestAllocationBeforeIt) {
  // Address 7 allocated at positions 0 and 4; a note at 4 is about the first, one at 5 the second.
  const std::vector<std::int64_t> positions{0, 2, 4};
  const std::vector<std::uint64_t> addresses{7, 9, 7};
  const ResolvedTags tags = resolve_tags(positions, addresses, {{4, 7, 3, -1}, {5, 7, 1, -1}, {5, 7, 2, -1}}, {},
                                         kCategories);
  EXPECT_EQ(tags.allocation, (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(tags.category, (std::vector<std::int64_t>{3, 1}));  // the lowest category wins
}

TEST(TagResolution, ModulesComeFromTheInnermostOpenSpanUnlessANoteNamesAnOwner) {
  // Span 0 (path 1) covers 0-10; span 1 (path 2) inside it covers 2-4; span 2 (path 3) opens at 6.
  const std::vector<ModuleSpan> spans{{0, 10, 1, -1}, {2, 4, 2, 0}, {6, -1, 3, 0}};
  const std::vector<std::int64_t> positions{1, 3, 5, 7, 11};
  const std::vector<std::uint64_t> addresses{1, 2, 3, 4, 5};
  const ResolvedTags tags = resolve_tags(positions, addresses, {{12, 5, 0, 9}}, spans, kCategories);
  EXPECT_EQ(tags.allocation, (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(tags.module, (std::vector<std::int64_t>{1, 2, 1, 3, 9}));
  EXPECT_EQ(tags.category, (std::vector<std::int64_t>{-1, -1, -1, -1, 0}));
}

TEST(TagResolution, RandomTracesAgreeWithTheContract) {
  std::mt19937_64 random(20261126);
  for (int trial = 0; trial < 300; ++trial) {
    const int events = std::uniform_int_distribution<int>(0, 60)(random);
    std::vector<std::int64_t> positions;
    std::vector<std::uint64_t> addresses;
    std::vector<ModuleSpan> spans;
    std::vector<std::int64_t> open;
    for (std::int64_t at = 0; at < events; ++at) {
      const int what = std::uniform_int_distribution<int>(0, 3)(random);
      if (what == 0) {
        spans.push_back({at, -1, static_cast<std::int64_t>(spans.size()) + 1, open.empty() ? -1 : open.back()});
        open.push_back(static_cast<std::int64_t>(spans.size()) - 1);
      } else if (what == 1 && !open.empty()) {
        spans[static_cast<std::size_t>(open.back())][1] = at;
        open.pop_back();
      } else {
        positions.push_back(at);
        addresses.push_back(std::uniform_int_distribution<std::uint64_t>(0, 5)(random));
      }
    }
    std::vector<TagNote> notes;
    const int count = std::uniform_int_distribution<int>(0, 30)(random);
    for (int n = 0; n < count; ++n) {
      notes.push_back({std::uniform_int_distribution<std::int64_t>(-2, events + 2)(random),
                       std::uniform_int_distribution<std::uint64_t>(0, 6)(random),
                       std::uniform_int_distribution<std::int64_t>(0, kCategories - 1)(random),
                       std::uniform_int_distribution<std::int64_t>(-1, 4)(random)});
    }
    SCOPED_TRACE(trial);
    expect_same(resolve_tags(positions, addresses, notes, spans, kCategories),
                brute_force(positions, addresses, notes, spans));
  }
}

}  // namespace
}  // namespace stowage
