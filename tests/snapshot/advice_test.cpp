// snapshot/advice: each rule on a hand-made trace (what fires, at the share's edge, its
// re-simulated saving and its words), the order of the advice, and bad arguments.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "snapshot/advice.hpp"

namespace stowage::snapshot {
namespace {

constexpr auto kP = static_cast<std::int8_t>(Category::kParameters);
constexpr auto kS = static_cast<std::int8_t>(Category::kStates);
constexpr auto kA = static_cast<std::int8_t>(Category::kActivations);
constexpr auto kI = static_cast<std::int8_t>(Category::kInputs);
constexpr auto kT = static_cast<std::int8_t>(Category::kTemporaries);

// A trace given as its positions: allocations (size, end) and frees (the size they end, end = n).
struct Hand {
  std::vector<std::uint8_t> is_alloc;
  std::vector<std::int64_t> end, size, own, index, live, site, step_starts;
  std::vector<std::int32_t> stack;
  std::vector<std::int8_t> flags, category;

  // `ends[p]`: for an allocation the position of its free (-1: never freed); for a free, -2.
  Hand(const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& ends, std::vector<std::int8_t> exact)
      : category(std::move(exact)) {
    const auto n = static_cast<std::int64_t>(sizes.size());
    std::int64_t running = 0;
    for (std::int64_t p = 0; p < n; ++p) {
      const bool alloc = ends[static_cast<std::size_t>(p)] != -2;
      is_alloc.push_back(alloc ? 1 : 0);
      end.push_back(alloc && ends[static_cast<std::size_t>(p)] >= 0 ? ends[static_cast<std::size_t>(p)] : n);
      size.push_back(sizes[static_cast<std::size_t>(p)]);
      own.push_back(alloc ? size.back() : -size.back());
      running += own.back();
      live.push_back(running);
      index.push_back(p);
      stack.push_back(-1);
      flags.push_back(0);
      site.push_back(0);
    }
  }
  AdviceTrace trace() const {
    return {LiveSeries(std::span<const std::int64_t>(live)), is_alloc, end, size, own, index, stack, flags, flags,
            false, step_starts, site, category, {}, 0};
  }
};

std::string b(std::size_t value) { return format_bytes(value); }

// 100 B of parameters, 50 of states, 30 of activations, 20 of inputs: the peak (200) at p3.
Hand four_categories() { return Hand({100, 50, 30, 20, 30, 20}, {-1, -1, 4, 5, -2, -2}, {kP, kS, kA, kI, kT, kT}); }

AdvicePeak peak_at(const Hand& h, std::int64_t position, const std::vector<std::int64_t>& live_at,
                   const std::vector<std::int8_t>& categories) {
  AdvicePeak peak;
  peak.position = position;
  peak.live_bytes = h.live[static_cast<std::size_t>(position)];
  peak.live_at = live_at;
  peak.category_at = categories;
  for (const std::int64_t p : live_at) {
    const auto at = static_cast<std::size_t>(p);
    peak.by_category[static_cast<std::size_t>(h.category[at])] += h.size[at];
  }
  return peak;
}

TEST(Advice, EachCategoryAtTheShareFiresWithItsSavingRemovedOverItsLifeLargestFirst) {
  const Hand h = four_categories();
  const AdviceTrace trace = h.trace();
  AdviceEvidence evidence(trace);
  const std::vector<std::int64_t> live_at = {0, 1, 2, 3};
  const std::vector<std::int8_t> categories = {kP, kS, kA, kI};
  const std::vector<Advice> found = advise(evidence, peak_at(h, 3, live_at, categories), {}, std::nullopt);
  ASSERT_EQ(found.size(), 3u);  // inputs: 20 B, exactly a tenth of the peak, fires
  EXPECT_EQ(found[0].rule, "optimizer states");
  EXPECT_EQ(found[0].waste, 50);
  EXPECT_EQ(found[0].saving, 50);
  EXPECT_EQ(found[0].upper_bound, false);
  EXPECT_EQ(found[0].text.rfind(b(50) + " of optimizer states live at the peak; keep them in host memory: ", 0), 0u);
  EXPECT_EQ(found[1].rule, "activations");
  EXPECT_EQ(found[1].saving, 30);  // removed: the peak moves to p3 without them, 170
  EXPECT_EQ(found[1].upper_bound, true);
  EXPECT_NE(found[1].text.find(" (at most " + b(30) + ": backward brings them back a block at a time)"),
            std::string::npos);
  EXPECT_EQ(found[2].rule, "inputs");
  EXPECT_EQ(found[2].saving, 20);
}

TEST(Advice, AWasteJustBelowTheShareDoesNotFire) {
  Hand h = four_categories();
  const AdviceTrace trace = h.trace();
  AdviceEvidence evidence(trace);
  const std::vector<std::int64_t> live_at = {0, 1, 2, 3};
  const std::vector<std::int8_t> categories = {kP, kS, kA, kI};
  AdvicePeak peak = peak_at(h, 3, live_at, categories);
  peak.by_category[static_cast<std::size_t>(kI)] = 19;  // below 0.1 * 200
  peak.by_category[static_cast<std::size_t>(kS)] = 0;
  const std::vector<Advice> found = advise(evidence, peak, {}, std::nullopt);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rule, "activations");
}

TEST(Advice, TheOptimizersTemporariesGoToTheHostWithItsStates) {
  Hand h = four_categories();
  h.flags[3] = kPython | kOptimizer;  // the inputs' allocation made under torch.optim
  const AdviceTrace trace = h.trace();
  AdviceEvidence evidence(trace);
  const std::vector<std::int64_t> live_at = {0, 1, 2, 3};
  const std::vector<std::int8_t> categories = {kP, kS, kA, kI};
  const std::vector<Advice> found = advise(evidence, peak_at(h, 3, live_at, categories), {}, std::nullopt);
  ASSERT_FALSE(found.empty());
  EXPECT_EQ(found[0].rule, "optimizer states");
  EXPECT_EQ(found[0].saving, 70);  // states and the update's temporary: 200 -> 130
}

TEST(Advice, MemoryGrowingEveryStepIsFreedWhenMadeAndNamedByItsSite) {
  // Site 1 keeps 10 B a step; site 0's 40 B come and go. Steps begin at p0 and p3.
  Hand h({10, 40, 40, 10, 40, 40}, {-1, 2, -2, -1, 5, -2}, std::vector<std::int8_t>(6, kT));
  h.site = {1, 0, 0, 1, 0, 0};
  h.step_starts = {3};
  const AdviceTrace trace = h.trace();
  AdviceEvidence evidence(trace);
  EXPECT_EQ(evidence.kept_across_steps(1), (std::vector<std::int64_t>{0}));  // p3's lives on in its own step
  const std::vector<std::int64_t> live_at = {0, 3, 4};
  const std::vector<std::int8_t> categories = {kT, kT, kT};
  const std::vector<GrowingSite> growing = {{1, "train.py:12", 10, 2}, {-1, "elsewhere", 5, 2}};
  const std::vector<Advice> found = advise(evidence, peak_at(h, 4, live_at, categories), growing, std::nullopt);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rule, "memory growing every step");
  EXPECT_EQ(found[0].waste, 20);
  EXPECT_EQ(found[0].saving, 10);  // p0 gone when step 0 ends: 60 -> 50
  EXPECT_EQ(found[0].text.rfind("train.py:12 (and 1 more sites) keeps " + b(10) + " more after every step", 0), 0u);
}

TEST(Advice, LogitSizedTensorsAreCutToAChunkOfEach) {
  // p1: the loss's own 80 B (its frames name a loss); p2: 40 B, half of it (16-bit logits).
  Hand h({100, 80, 40, 80, 40}, {-1, 3, 4, -2, -2}, {kP, kA, kT, kT, kT});
  std::vector<std::int8_t> marked(5, kPython);
  marked[1] = kPython | kLoss;
  AdviceTrace trace = h.trace();
  trace.marked = marked;
  trace.frames = true;
  AdviceEvidence evidence(trace);
  const std::vector<std::int64_t> live_at = {0, 1, 2};
  const std::vector<std::int8_t> categories = {kP, kA, kT};
  AdvicePeak peak = peak_at(h, 2, live_at, categories);
  peak.by_category = {};  // (the category rules apart)
  const std::vector<Advice> found = advise(evidence, peak, {}, std::nullopt);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rule, "logits at the peak");
  EXPECT_EQ(found[0].waste, 120);
  EXPECT_EQ(found[0].saving, 105);  // 80 -> 10 and 40 -> 5: the peak 220 -> 115
  EXPECT_NE(found[0].text.find("compute the loss in 8 chunks of the tokens"), std::string::npos);
}

TEST(Advice, AnOutOfMemoryWithTheBytesFreeInPiecesIsAdvisedStowagesAllocator) {
  const Hand h({}, {}, {});
  const AdviceTrace trace = h.trace();
  AdviceEvidence evidence(trace);
  const AdvicePeak peak;
  std::vector<Advice> found = advise(evidence, peak, {}, OomFacts{100, 60, 50, 1000});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].waste, 50);
  EXPECT_EQ(found[0].saving, 40);
  EXPECT_NE(found[0].text.find(", whose replay of this trace peaks at " + b(1000) + " reserved"), std::string::npos);
  EXPECT_TRUE(advise(evidence, peak, {}, OomFacts{100, 60, 30, std::nullopt}).empty());  // the cache holds too little
  EXPECT_TRUE(advise(evidence, peak, {}, OomFacts{50, 60, 30, std::nullopt}).empty());   // not short at all
}

TEST(Advice, AnOutOfMemoryUnderStowagesAllocatorIsNotAdvisedStowagesAllocator) {
  const Hand h({}, {}, {});
  const AdviceTrace trace = h.trace();
  AdviceEvidence evidence(trace);
  const AdvicePeak peak;
  EXPECT_TRUE(advise(evidence, peak, {}, OomFacts{100, 60, 50, 1000, /*under_stowage=*/true}).empty());
}

TEST(Advice, BadArgumentsAreRefusedNamingThem) {
  Hand h = four_categories();
  AdviceTrace trace = h.trace();
  const std::vector<std::int64_t> short_end = {6, 6};
  trace.end = short_end;
  EXPECT_THROW(AdviceEvidence{trace}, LogicError);
  const AdviceTrace good = h.trace();
  AdviceEvidence evidence(good);
  AdvicePeak peak;
  peak.position = 6;  // past the last position
  EXPECT_THROW(advise(evidence, peak, {}, std::nullopt), LogicError);
  AdvicePeak huge;
  huge.by_category[static_cast<std::size_t>(kS)] = Wide{1} << 70;  // bytes past 2**64 cannot be written
  huge.position = 3;
  huge.live_bytes = Wide{1} << 71;
  EXPECT_THROW(advise(evidence, huge, {}, std::nullopt), LogicError);
}

}  // namespace
}  // namespace stowage::snapshot
