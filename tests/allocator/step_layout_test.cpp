// Step layouts (step_layout.hpp) and the StepLearner that makes them (step_learner.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "allocator/step_layout.hpp"
#include "allocator/step_learner.hpp"
#include "base/errors.hpp"

namespace stowage {
namespace {

// Every tick at which a lifetime is live, on a cycle of `period`.
std::vector<bool> live_ticks(const Lifetime& l, std::size_t period) {
  std::vector<bool> ticks(period, false);
  const std::size_t length = l.end > l.start ? l.end - l.start : l.end + period - l.start;
  for (std::size_t t = 0; t < length; ++t) ticks[(l.start + t) % period] = true;
  return ticks;
}

void expect_no_conflicts(const std::vector<Lifetime>& lifetimes, const StepLayout& layout,
                         std::size_t period) {
  ASSERT_EQ(layout.offsets.size(), lifetimes.size());
  for (std::size_t i = 0; i < lifetimes.size(); ++i) {
    EXPECT_LE(layout.offsets[i] + lifetimes[i].bytes, layout.arena_bytes);
    for (std::size_t j = i + 1; j < lifetimes.size(); ++j) {
      if (!lifetimes_overlap(lifetimes[i], lifetimes[j], period)) continue;
      const bool apart = layout.offsets[i] + lifetimes[i].bytes <= layout.offsets[j] ||
                         layout.offsets[j] + lifetimes[j].bytes <= layout.offsets[i];
      ASSERT_TRUE(apart) << "lifetimes " << i << " and " << j << " overlap in time and address";
    }
  }
  EXPECT_GE(layout.arena_bytes, layout.peak_live_bytes);
}

TEST(StepLayout, OverlapOnTheCycleMatchesTheTicksBothAreLive) {
  constexpr std::size_t kPeriod = 7;
  std::vector<Lifetime> all;
  for (std::size_t start = 0; start < kPeriod; ++start) {
    for (std::size_t end = 0; end <= kPeriod; ++end) {
      if (end == start) continue;
      all.push_back({512, start, end});
    }
  }
  for (const Lifetime& a : all) {
    const std::vector<bool> ta = live_ticks(a, kPeriod);
    for (const Lifetime& b : all) {
      const std::vector<bool> tb = live_ticks(b, kPeriod);
      bool shared = false;
      for (std::size_t t = 0; t < kPeriod; ++t) shared = shared || (ta[t] && tb[t]);
      EXPECT_EQ(lifetimes_overlap(a, b, kPeriod), shared)
          << a.start << "-" << a.end << " vs " << b.start << "-" << b.end;
    }
  }
}

TEST(StepLayout, AnAllocationAcrossTheBoundaryConflictsWithTheNextStepsStart) {
  // Gradient-like: made late in the step, freed early in the next.
  const std::vector<Lifetime> lifetimes = {
      {1024, 8, 2},  // across the boundary
      {1024, 0, 1},  // early in the step: conflicts with the first
      {1024, 3, 6},  // mid-step: free to share its address
  };
  const StepLayout layout = lay_out_step(lifetimes, 10);
  expect_no_conflicts(lifetimes, layout, 10);
  EXPECT_EQ(layout.arena_bytes, 2048u);
  EXPECT_EQ(layout.peak_live_bytes, 2048u);
}

TEST(StepLayout, ATrainingShapedStepPacksNearItsLivePeak) {
  // Forward saves one activation per layer and frees a temporary; backward frees them in
  // reverse while gradients (freed next step) accumulate.
  std::mt19937_64 random(3);
  std::uniform_int_distribution<std::size_t> pages(1, 64);
  constexpr std::size_t kLayers = 40;
  std::vector<Lifetime> lifetimes;
  std::vector<std::size_t> saved_bytes(kLayers);
  std::size_t tick = 0;
  const std::size_t period = 4 * kLayers + 2;
  std::vector<std::size_t> saved_index(kLayers);
  for (std::size_t i = 0; i < kLayers; ++i) {
    saved_bytes[i] = pages(random) * 512 * 1024;
    lifetimes.push_back({saved_bytes[i] / 2, tick, tick + 2});  // a temporary
    ++tick;
    saved_index[i] = lifetimes.size();
    lifetimes.push_back({saved_bytes[i], tick, 0});  // end filled in below
    ++tick;
  }
  for (std::size_t i = kLayers; i-- > 0;) {
    lifetimes[saved_index[i]].end = tick + 1;
    lifetimes.push_back({saved_bytes[i] / 4, tick, 1});  // a gradient, freed next step
    tick += 2;
  }
  ASSERT_LE(tick, period);
  const StepLayout layout = lay_out_step(lifetimes, period);
  expect_no_conflicts(lifetimes, layout, period);
  EXPECT_LE(static_cast<double>(layout.arena_bytes),
            1.05 * static_cast<double>(layout.peak_live_bytes));
}

TEST(StepLayout, RandomLifetimesNeverShareAddressWhileBothLive) {
  std::mt19937_64 random(11);
  for (int round = 0; round < 50; ++round) {
    const std::size_t period = 5 + random() % 200;
    std::vector<Lifetime> lifetimes(1 + random() % 150);
    for (Lifetime& l : lifetimes) {
      l.bytes = 512 * (1 + random() % 4096);
      l.start = random() % period;
      do {
        l.end = random() % (period + 1);
      } while (l.end == l.start);
    }
    const StepLayout layout = lay_out_step(lifetimes, period);
    expect_no_conflicts(lifetimes, layout, period);
  }
}

TEST(StepLayout, LifetimesOutsideTheStepAreRefused) {
  EXPECT_THROW(lay_out_step({{512, 10, 2}}, 10), LogicError);
  EXPECT_THROW(lay_out_step({{0, 1, 2}}, 10), LogicError);
  EXPECT_THROW(lay_out_step({{512, 1, 11}}, 10), LogicError);
  EXPECT_THROW(lay_out_step({}, 0), LogicError);
  EXPECT_EQ(lay_out_step({}, 4).arena_bytes, 0u);
}

// --- StepLearner ---

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Drives a learner through one step of a layered model: forward saves per layer (with a
// temporary), backward frees in reverse; `grads` live from backward to the next step's start.
struct LayeredStep {
  std::size_t layers = 6;
  std::size_t scale = 1;
  bool alike = false;  // every layer the same (a transformer's): then only live bytes tell them
                       // from steps
  void run(StepLearner& learner, std::vector<std::uint64_t>& grads, bool mark) const {
    for (std::uint64_t g : grads) learner.record_free(g);
    grads.clear();
    std::vector<std::uint64_t> saved;
    for (std::size_t i = 0; i < layers; ++i) {
      const std::uint64_t temporary = learner.record_malloc(3 * kMiB * scale);
      saved.push_back(learner.record_malloc((4 + (alike ? 0 : i)) * kMiB * scale));
      learner.record_free(temporary);
    }
    for (std::size_t i = layers; i-- > 0;) {
      grads.push_back(learner.record_malloc(2 * kMiB * scale));
      learner.record_free(saved[i]);
    }
    if (mark) learner.mark_step();
  }
};

TEST(StepLearner, MarkedStepsThatRepeatGiveALayoutOfTheWholeStep) {
  StepLearner learner;
  std::vector<std::uint64_t> grads;
  const LayeredStep step;
  step.run(learner, grads, true);
  EXPECT_FALSE(learner.take_layout().has_value());
  step.run(learner, grads, true);
  EXPECT_FALSE(learner.take_layout().has_value());
  step.run(learner, grads, true);  // two whole marked steps alike
  const std::optional<StepLearner::Layout> layout = learner.take_layout();
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(learner.phase(), StepLearner::Phase::kPlaced);
  ASSERT_EQ(layout->allocations.size(), 3 * step.layers);
  // Every allocation lives less than a step, gradients included (freed at the next start).
  for (const StepLearner::LayoutEntry& a : layout->allocations) {
    EXPECT_NE(a.offset, StepLearner::kDynamic);
  }
  EXPECT_GE(layout->arena_bytes, layout->peak_live_bytes);
  // The layout follows the step, allocation by allocation, and wraps around.
  for (int repeat = 0; repeat < 2; ++repeat) {
    for (std::size_t i = 0; i < step.layers; ++i) {
      ASSERT_NE(learner.next_entry(3 * kMiB), nullptr);
      ASSERT_NE(learner.next_entry((4 + i) * kMiB), nullptr);
    }
    for (std::size_t i = 0; i < step.layers; ++i) ASSERT_NE(learner.next_entry(2 * kMiB), nullptr);
    EXPECT_FALSE(learner.mark_step());
  }
  EXPECT_EQ(learner.departures(), 0);
}

TEST(StepLearner, WithoutMarksTheStepIsFoundNotALayer) {
  StepLearner learner;
  std::vector<std::uint64_t> grads;
  LayeredStep first;
  first.scale = 2;  // the first step differs (as optimizer state appears in a real one)
  first.run(learner, grads, false);
  const LayeredStep step{12, 1, true};
  std::optional<StepLearner::Layout> layout;
  for (int i = 0; i < 6 && !layout; ++i) {
    step.run(learner, grads, false);
    layout = learner.take_layout();
  }
  ASSERT_TRUE(layout.has_value());
  // One step: 12 layers x (alloc temp, alloc saved, free temp) + 12 x (alloc grad, free saved)
  // + 12 frees of the previous step's gradients.
  EXPECT_EQ(layout->period_events, 12u * 3 + 12u * 2 + 12u);
  EXPECT_EQ(layout->allocations.size(), 36u);
  // The layout's step starts where the fewest bytes are live: after the gradients are freed, at
  // the first layer's temporary, wherever in the step the repeat was noticed.
  EXPECT_EQ(layout->allocations[0].bytes, 3 * kMiB);
  EXPECT_EQ(layout->allocations[1].bytes, 4 * kMiB);
  // The learner follows the program from where it is to that start, leaving those requests
  // dynamic, then places.
  std::size_t waited = 0;
  const std::size_t count = layout->allocations.size();
  const std::size_t ahead = (count - layout->next) % count;
  while (learner.waiting()) {
    const StepLearner::LayoutEntry* next =
        learner.next_entry(layout->allocations[(layout->next + waited) % 36].bytes);
    ASSERT_NE(next, nullptr);
    EXPECT_EQ(next->offset, StepLearner::kDynamic);
    ++waited;
  }
  EXPECT_EQ(waited, ahead);
  const StepLearner::LayoutEntry* placed = learner.next_entry(3 * kMiB);
  ASSERT_NE(placed, nullptr);
  EXPECT_NE(placed->offset, StepLearner::kDynamic);
}

TEST(StepLearner, ALoopOfAFewAllocationsIsNotTakenForAStep) {
  StepLearner learner;
  std::vector<std::uint64_t> live;
  for (int i = 0; i < 2000; ++i) {  // 16 allocations made and freed, over and over
    for (std::size_t k = 0; k < 16; ++k) live.push_back(learner.record_malloc((k + 2) * kMiB));
    for (std::uint64_t id : live) learner.record_free(id);
    live.clear();
  }
  EXPECT_FALSE(learner.take_layout().has_value());
}

TEST(StepLearner, ADifferentRequestIsADepartureAndTheSamePeriodIsNotLearnedAgain) {
  StepLearner learner;
  std::vector<std::uint64_t> grads;
  const LayeredStep step;
  for (int i = 0; i < 3; ++i) step.run(learner, grads, true);
  ASSERT_TRUE(learner.take_layout().has_value());
  EXPECT_NE(learner.next_entry(3 * kMiB), nullptr);
  EXPECT_EQ(learner.next_entry(5 * kMiB), nullptr);  // the layout said 4 MiB
  EXPECT_EQ(learner.phase(), StepLearner::Phase::kLearning);
  EXPECT_EQ(learner.departures(), 1);
  // A step that ends early is a departure too.
  grads.clear();
  for (int i = 0; i < 3; ++i) step.run(learner, grads, true);
  ASSERT_TRUE(learner.take_layout().has_value());
  EXPECT_NE(learner.next_entry(3 * kMiB), nullptr);
  EXPECT_TRUE(learner.mark_step());
  EXPECT_EQ(learner.departures(), 2);
}

TEST(StepLearner, PeekingDoesNotMoveThroughTheLayoutCommittingDoes) {
  StepLearner learner;
  std::vector<std::uint64_t> grads;
  const LayeredStep step;
  for (int i = 0; i < 3; ++i) step.run(learner, grads, true);
  ASSERT_TRUE(learner.take_layout().has_value());
  // A request that fails and is tried again is seen twice, and is one request of the layout.
  ASSERT_NE(learner.peek_entry(3 * kMiB), nullptr);
  ASSERT_NE(learner.peek_entry(3 * kMiB), nullptr);
  learner.commit_entry();
  ASSERT_NE(learner.peek_entry(4 * kMiB), nullptr);
  EXPECT_EQ(learner.departures(), 0);
}

TEST(StepLearner, AMarkedStepWithNothingToLayOutIsTriedOnce) {
  StepLearner learner;
  std::vector<std::uint64_t> ids;
  for (int step = 0; step < 2000; ++step) {
    ids.push_back(learner.record_malloc(4 * kMiB));  // lives two steps: nothing to lay out
    if (ids.size() > 2) {
      learner.record_free(ids.front());
      ids.erase(ids.begin());
    }
    learner.mark_step();
    ASSERT_FALSE(learner.take_layout().has_value());
  }
  EXPECT_EQ(learner.layouts_made(), 0u);
  EXPECT_LE(learner.events_held(), StepLearner::kMaxEvents);
}

TEST(StepLearner, StopsAfterRepeatedDepartures) {
  StepLearner learner;
  for (int departure = 0; departure < StepLearner::kMaxDepartures; ++departure) {
    std::vector<std::uint64_t> grads;
    const LayeredStep step;
    for (int i = 0; i < 3; ++i) step.run(learner, grads, true);
    ASSERT_TRUE(learner.take_layout().has_value()) << departure;
    learner.depart();
  }
  EXPECT_EQ(learner.phase(), StepLearner::Phase::kOff);
  EXPECT_EQ(learner.record_malloc(kMiB), StepLearner::kNoRecord);
}

TEST(StepLearner, KeepsBoundedMemoryOnASequenceThatNeverRepeats) {
  StepLearner learner;
  std::mt19937_64 random(5);
  std::vector<std::uint64_t> live;
  for (int i = 0; i < 300000; ++i) {
    if (live.empty() || random() % 2 == 0) {
      live.push_back(learner.record_malloc(512 * (1 + random() % 100000)));
    } else {
      const std::size_t k = random() % live.size();
      learner.record_free(live[k]);
      live[k] = live.back();
      live.pop_back();
    }
    ASSERT_LE(learner.events_held(), StepLearner::kMaxEvents);
  }
  EXPECT_FALSE(learner.take_layout().has_value());
  EXPECT_EQ(learner.layouts_made(), 0u);
}

}  // namespace
}  // namespace stowage
