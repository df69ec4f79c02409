// snapshot/inspection: stowage inspect's findings in one call, on hand-made segments and traces
// whose answers are worked out by hand: sites named from frames or size classes, totals and
// fragmentation, segments held by one small block, the peak over a baseline with an unknown free,
// fit's trial steps set apart, an OOM's live bytes, and stowage's tags placed by event.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/errors.hpp"
#include "snapshot/inspection.hpp"
#include "snapshot/names.hpp"

namespace stowage::snapshot {
namespace {

const std::uint8_t kAlloc = *action_code(Name::kAlloc);
const std::uint8_t kFree = *action_code(Name::kFreeCompleted);
const std::uint8_t kOom = *action_code(Name::kOom);
const std::uint8_t kMark = *action_code(Name::kSnapshot);

Frame frame(const std::string& filename, const std::string& line, const std::string& name) {
  return {filename, line, name, true};
}

TEST(FrameSites, TheInnermostUserFrameElseTheInnermostPythonFrameElseNone) {
  const std::vector<Frame> library{frame("/usr/lib/python3.11/site-packages/torch/nn/x.py", "3", "forward"),
                                   frame("/home/u/train.py", "7", "step"), frame("??", "0", "cpp")};
  EXPECT_EQ(frame_site(library), "/home/u/train.py:7 in step");
  const std::vector<Frame> torch_only{frame("a.cpp", "1", "f"), frame("/x/torch/y.py", "2", "g")};
  EXPECT_EQ(frame_site(torch_only), "/x/torch/y.py:2 in g");
  EXPECT_EQ(frame_site(std::vector<Frame>{frame("a.cpp", "1", "f")}), std::nullopt);
  EXPECT_EQ(frame_site(std::vector<Frame>{{"/home/u/t.py", "4", "", false}}), "/home/u/t.py:4 in ?");
}

TEST(FrameSites, SizeClassesArePowersOfFourFrom512Bytes) {
  EXPECT_EQ(size_class(0), "size <= 512 B");
  EXPECT_EQ(size_class(512), "size <= 512 B");
  EXPECT_EQ(size_class(513), "size 512 B-2.00 KiB");
  EXPECT_EQ(size_class(2048), "size 512 B-2.00 KiB");
  EXPECT_EQ(size_class(2049), "size 2.00 KiB-8.00 KiB");
  EXPECT_EQ(size_class_number(std::uint64_t{1} << 50), 20);  // 2**49 < 2**50 <= 2**51
}

BlockFacts block(Wide size, const char* state, std::optional<std::string> site = std::nullopt) {
  return {size, size, state, std::move(site)};
}

TEST(SegmentFindings, TotalsFragmentationAndSegmentsHeldByOneSmallBlock) {
  const std::vector<SegmentInput> segments{
      {0x1000, 8 << 20, false, {block(1 << 20, "active_allocated", "a.py:1 in f"), block(7 << 20, "inactive")}},
      {0x9000, 2 << 20, false, {block(1 << 20, "inactive"), block(1 << 20, "active_pending_free")}},
      {0xa000, 64 << 20, true, {block(1 << 10, "active_allocated"), block((64 << 20) - (1 << 10), "inactive")}}};
  const Totals totals = totals_of(segments);
  EXPECT_EQ(totals.reserved, Wide{74} << 20);
  EXPECT_EQ(totals.allocated, (Wide{1} << 20) + (1 << 10));
  EXPECT_EQ(totals.active, (Wide{2} << 20) + (1 << 10));
  EXPECT_EQ(totals.largest_free_block, (Wide{64} << 20) - (1 << 10));
  const Wide free = totals.reserved - totals.active;
  EXPECT_DOUBLE_EQ(totals.fragmentation,
                   1 - static_cast<double>(totals.largest_free_block) / static_cast<double>(free));
  const SegmentSummary summary = summary_of(segments, 10);
  ASSERT_EQ(summary.by_size.size(), 3U);
  EXPECT_EQ(summary.by_size[0].size, "<= 2 MiB");
  EXPECT_EQ(summary.by_size[1].size, "<= 20 MiB");
  EXPECT_EQ(summary.by_size[2].bytes, Wide{64} << 20);
  // The first segment: one live block of 1 MiB in 8 MiB; the expandable one never counts.
  ASSERT_EQ(summary.held_by_one_small_block.size(), 1U);
  EXPECT_EQ(summary.held_by_one_small_block[0].held_back, Wide{7} << 20);
  EXPECT_EQ(summary.held_by_one_small_block[0].site, "a.py:1 in f");
  ASSERT_EQ(summary.fill_quartiles.size(), 3U);
  EXPECT_DOUBLE_EQ(summary.fill_quartiles[1], 0.125);
  const std::vector<SiteLive> sites = sites_at_end(segments, 10);
  ASSERT_EQ(sites.size(), 2U);
  EXPECT_EQ(sites[0].site, "a.py:1 in f");
  EXPECT_EQ(sites[1].site, "size 512 B-2.00 KiB");
}

struct Trace {
  std::vector<std::uint8_t> action;
  std::vector<std::uint64_t> addr, size;
  std::vector<std::int32_t> stack;
  std::vector<std::vector<Frame>> stacks{{frame("/home/u/train.py", "1", "f")}};

  void add(std::uint8_t what, std::uint64_t address, std::uint64_t bytes, std::int32_t from = 0) {
    action.push_back(what);
    addr.push_back(address);
    size.push_back(bytes);
    stack.push_back(from);
  }
  TraceInput input() const {
    TraceInput out{action, addr, size, stack, stacks, {}, {}};
    out.marks.events = static_cast<std::int64_t>(action.size());
    return out;
  }
};

TEST(Inspection, ThePeakCountsWhatWasLiveBeforeTheTraceLessItsUnknownFrees) {
  Trace trace;
  trace.add(kAlloc, 0x10, 100);
  trace.add(kFree, 0x99, 30);  // an address the trace never allocated
  trace.add(kAlloc, 0x20, 50, -1);
  trace.add(kOom, 0, 1000);
  trace.add(kFree, 0x10, 100);
  // Segments at the end: 80 requested bytes live, of which the trace's own are 50.
  const std::vector<SegmentInput> segments{{0, 80, false, {block(80, "active_allocated")}}};
  const Findings found = inspect(trace.input(), segments, {});
  // baseline = requested at the end - the trace's own + its unknown frees = 80 - 50 + 30 = 60
  EXPECT_EQ(found.trace.peak.baseline, 60);
  EXPECT_EQ(found.trace.peak.live_bytes, 60 - 30 + 150);  // just after the second allocation
  EXPECT_EQ(found.trace.peak.event_index, 2);
  ASSERT_EQ(found.trace.peak.sites.size(), 3U);
  EXPECT_EQ(found.trace.peak.sites[0].site, "/home/u/train.py:1 in f");
  EXPECT_EQ(found.trace.peak.sites[1].site, "size <= 512 B");
  EXPECT_EQ(found.trace.peak.sites[2].site, kBeforeTrace);
  EXPECT_EQ(found.trace.peak.sites[2].bytes, 30);
  ASSERT_EQ(found.trace.ooms.size(), 1U);
  EXPECT_EQ(found.trace.ooms[0].live_bytes, 60 - 30 + 150);
  EXPECT_EQ(found.trace.ooms[0].requested, 1000);
  EXPECT_EQ(found.trace.ooms[0].sites[1].site, "size <= 512 B");
}

TEST(Inspection, FitsTrialStepsAreLeftOutOfTheHeadlinePeak) {
  Trace trace;
  trace.add(kMark, 0, 0);  // trial begins
  trace.add(kAlloc, 0x10, 500);
  trace.add(kFree, 0x10, 500);
  trace.add(kMark, 0, 0);  // trial ends
  trace.add(kAlloc, 0x20, 200);
  TraceInput input = trace.input();
  input.marks.trial_begins = {0};
  input.marks.trial_ends = {3};
  const Findings found = inspect(input, {}, {});
  EXPECT_EQ(found.trace.peak.live_bytes, 200);
  EXPECT_EQ(found.trace.peak.event_index, 4);
  ASSERT_TRUE(found.trace.fit_trial_peak.has_value());
  EXPECT_EQ(found.trace.fit_trial_peak->live_bytes, 500);
}

TEST(Inspection, StowagesTagsGiveTheCategoriesAndModulesAtThePeak) {
  Trace trace;
  trace.add(kAlloc, 0x10, 100);
  trace.add(kAlloc, 0x20, 40);
  InspectOptions options;
  options.tags = ExactTags{{0}, {static_cast<std::int8_t>(Category::kActivations)}, {1}, {"", "model.h.0"},
                           {-1, 0}, {"model.h.0"}};
  const Findings found = inspect(trace.input(), {}, options);
  EXPECT_TRUE(found.trace.exact_categories);
  const std::vector<std::pair<std::string, Wide>> expected{{"activations", 100}, {"temporaries", 40}};
  EXPECT_EQ(found.trace.peak.categories, expected);
  ASSERT_EQ(found.trace.peak.modules.size(), 2U);
  EXPECT_EQ(found.trace.peak.modules[0].module, "model.h.0");
  EXPECT_EQ(found.trace.peak.modules[1].bytes, 40);
  options.tags->events = {1 + 5};  // beyond the trace: named, not a wrong answer
  EXPECT_THROW(inspect(trace.input(), {}, options), LogicError);
}

}  // namespace
}  // namespace stowage::snapshot
