// snapshot/trace_steps: steps cut at marks with fit's trial spans apart, found by repetition in
// traces without marks (alike or leaking), not found where nothing repeats; on random traces the
// run's steps follow each other and each one's peak is the highest live bytes over its events.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "base/errors.hpp"
#include "snapshot/trace_steps.hpp"

namespace stowage::snapshot {
namespace {

// A trace of positions with an event index each (events between them are other actions).
struct Trace {
  std::vector<std::int64_t> index, live, size;
  std::vector<std::uint8_t> is_alloc;
  std::int64_t events = 0;

  void add(bool alloc, std::int64_t bytes) {
    index.push_back(events++);
    is_alloc.push_back(alloc ? 1 : 0);
    size.push_back(bytes);
    live.push_back((live.empty() ? 0 : live.back()) + (alloc ? bytes : -bytes));
  }
  Steps cut(const StepMarks& marks) const {
    return cut_steps(marks, index, LiveSeries(std::span<const std::int64_t>(live)), is_alloc, size);
  }
};

// `steps` training steps of a model: weights made once, then forward allocations freed in
// reverse, `leak` bytes kept each step.
Trace training(int steps, std::int64_t leak) {
  Trace t;
  t.add(true, 1 << 20);
  for (int s = 0; s < steps; ++s) {
    for (std::int64_t k = 1; k <= 12; ++k) t.add(true, 1000 * k + 7);
    for (std::int64_t k = 12; k >= 1; --k) t.add(false, 1000 * k + 7);
    if (leak > 0) t.add(true, leak);
  }
  return t;
}

// The run's steps follow each other, and fit's trial steps each other (a run's step holds what
// came before a trial and after it: its events span the trial's); each step's peak is the
// highest live bytes over its events.
void expect_steps_follow_and_peak(const Trace& t, const Steps& found) {
  std::int64_t last_of[2] = {-1, -1};  // (a run's step, a trial step)
  for (std::size_t k = 0; k < found.steps.size(); ++k) {
    const Step& step = found.steps[k];
    EXPECT_EQ(step.number, static_cast<std::int64_t>(k));
    EXPECT_GT(step.first_event, last_of[step.fit_trial ? 1 : 0]);
    EXPECT_LE(step.first_event, step.last_event);
    last_of[step.fit_trial ? 1 : 0] = step.last_event;
    const auto a = static_cast<std::size_t>(std::lower_bound(t.index.begin(), t.index.end(), step.first_event) -
                                            t.index.begin());
    const auto b = static_cast<std::size_t>(std::upper_bound(t.index.begin(), t.index.end(), step.last_event) -
                                            t.index.begin());
    ASSERT_LT(a, b);
    const std::int64_t highest = *std::max_element(t.live.begin() + static_cast<std::ptrdiff_t>(a),
                                                   t.live.begin() + static_cast<std::ptrdiff_t>(b));
    EXPECT_TRUE(step.peak_bytes == highest);
    EXPECT_TRUE(step.end_bytes == t.live[b - 1]);
  }
}

TEST(TraceSteps, MarksEndStepsAndFitsTrialSpansAreStepsOfTheirOwn) {
  const Trace t = training(4, 0);  // 1 + 4 * 24 positions, events 0..96
  StepMarks marks{{30, 60, 90}, {40}, {50}, t.events};
  const Steps found = t.cut(marks);
  EXPECT_EQ(found.found_by, "marks");
  // Pieces: 0..30 (a step), 31..39 (set aside for the next), 40..50 (the trial), 51..60 (a step
  // with 31..39), 61..90 (a step); what follows the last mark is no step.
  ASSERT_EQ(found.steps.size(), 4U);
  EXPECT_EQ(found.steps[0].first_event, 0);
  EXPECT_EQ(found.steps[0].last_event, 30);
  EXPECT_TRUE(found.steps[1].fit_trial);
  EXPECT_EQ(found.steps[1].first_event, 40);
  EXPECT_EQ(found.steps[1].last_event, 50);
  EXPECT_EQ(found.steps[2].first_event, 31);
  EXPECT_EQ(found.steps[2].last_event, 60);
  EXPECT_FALSE(found.steps[2].fit_trial);
  EXPECT_EQ(found.steps[3].last_event, 90);
  EXPECT_EQ(in_trial(marks, std::vector<std::int64_t>{40, 41, 49, 50, 7}), (std::vector<std::uint8_t>{0, 1, 1, 0, 0}));
}

TEST(TraceSteps, ATraceWithoutMarksIsCutWhereItsAllocationsRepeat) {
  for (const std::int64_t leak : {std::int64_t{0}, std::int64_t{64}}) {
    const Trace t = training(8, leak);
    const Steps found = t.cut(StepMarks{{}, {}, {}, t.events});
    EXPECT_EQ(found.found_by, "repeating allocations") << "leak " << leak;
    EXPECT_GE(found.steps.size(), 6U) << "leak " << leak;
    expect_steps_follow_and_peak(t, found);
  }
}

TEST(TraceSteps, ATraceThatNeverRepeatsHasNoSteps) {
  Trace t;
  for (std::int64_t k = 1; k <= 200; ++k) t.add(true, 4096 * k);
  const Steps found = t.cut(StepMarks{{}, {}, {}, t.events});
  EXPECT_EQ(found.found_by, "");
  EXPECT_TRUE(found.steps.empty());
}

TEST(TraceSteps, BadArgumentsAreRefused) {
  const Trace t = training(1, 0);
  EXPECT_THROW(t.cut(StepMarks{{9, 3}, {}, {}, t.events}), LogicError);  // marks out of order
  EXPECT_THROW(cut_steps(StepMarks{{}, {}, {}, t.events}, t.index, LiveSeries(), t.is_alloc, t.size), LogicError);
}

TEST(TraceSteps, RandomTracesStepsFollowEachOtherWithTheirPeaks) {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 100; ++round) {
    Trace t = training(2 + static_cast<int>(rng() % 6), static_cast<std::int64_t>(rng() % 2) * 32);
    std::vector<std::int64_t> marks, begins, ends;
    for (std::int64_t e = 0; e < t.events; ++e) {
      const std::uint64_t r = rng() % 40;
      if (r == 0) marks.push_back(e);
      if (r == 1) begins.push_back(e);
      if (r == 2) ends.push_back(e);
    }
    const StepMarks step_marks{marks, begins, ends, t.events};
    const Steps found = t.cut(step_marks);
    expect_steps_follow_and_peak(t, found);
    // in_trial, against each position checked span by span.
    const std::vector<std::uint8_t> inside = in_trial(step_marks, t.index);
    for (std::size_t p = 0; p < t.index.size(); ++p) {
      bool expected = false;
      for (const std::int64_t begin : begins) {
        const auto next = std::upper_bound(ends.begin(), ends.end(), begin);
        const std::int64_t end = next == ends.end() ? t.events : *next;
        expected = expected || (t.index[p] > begin && t.index[p] < end);
      }
      EXPECT_EQ(inside[p] != 0, expected) << "round " << round << " position " << p;
    }
  }
}

TEST(TraceSteps, FloatSumsAreNumpysPairwiseOnes) {
  std::vector<std::int64_t> small(20000);
  for (std::size_t i = 0; i < small.size(); ++i) small[i] = static_cast<std::int64_t>(i % 977);
  std::int64_t exact = 0;
  for (const std::int64_t v : small) exact += v;
  EXPECT_EQ(numpy_float_sum(small), static_cast<double>(exact));  // exact below 2**53
  // Past 2**53 the order rounds: the figures numpy gives (numpy 2.4).
  std::vector<std::int64_t> rounding(16, 1);
  rounding[0] = (std::int64_t{1} << 53) + 2;
  EXPECT_EQ(numpy_float_sum(rounding), 0x1p53 + 18);
  std::vector<std::int64_t> buffers(20000, 1);
  buffers[0] = std::int64_t{1} << 53;
  EXPECT_EQ(numpy_float_sum(buffers), 0x1p53 + 19984);
}

}  // namespace
}  // namespace stowage::snapshot
