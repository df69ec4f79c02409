// snapshot/device_events: the events replay takes, the recording allocator's reserved peak, and
// the period of a trace's steps (on random step sequences, the smallest period that holds), and
// the native figures: which allocations landed in segments held before the trace began; and
// torch.profiler's events put in order.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "base/errors.hpp"
#include "snapshot/device_events.hpp"
#include "snapshot/names.hpp"
#include "snapshot/native_figures.hpp"
#include "snapshot/profiler_order.hpp"

namespace stowage::snapshot {
namespace {

std::uint8_t code(Name name) { return *action_code(name); }

TEST(DeviceEvents, AllocsFreesCompletedAndMarkedSnapshotsAreKeptInOrder) {
  const std::vector<std::uint8_t> action{code(Name::kAlloc),        code(Name::kFreeRequested), code(Name::kFreeCompleted),
                                         code(Name::kSnapshot),     code(Name::kSnapshot),      code(Name::kSegmentAlloc),
                                         code(Name::kAlloc)};
  const std::vector<std::uint64_t> addr{16, 16, 16, 1, 2, 4096, 32}, size{8, 8, 8, 5, 5, 4096, 9}, stream{3, 3, 3, 3, 3, 3, 4};
  const TraceColumnsView columns{action, addr, size, stream};
  const std::vector<std::int64_t> marks{3, 5};  // 5 is no snapshot event: not a step's end
  ASSERT_EQ(count_device_events(columns, marks), 4U);
  std::vector<std::uint8_t> kinds(4);
  std::vector<std::uint64_t> a(4), s(4), st(4);
  fill_device_events(columns, marks, kinds, a, s, st);
  EXPECT_EQ(kinds, (std::vector<std::uint8_t>{kReplayAlloc, kReplayFree, kReplayStepEnd, kReplayAlloc}));
  EXPECT_EQ(a, (std::vector<std::uint64_t>{16, 16, 0, 32}));
  EXPECT_EQ(st, (std::vector<std::uint64_t>{3, 3, 0, 4}));
  EXPECT_THROW(count_device_events(columns, std::vector<std::int64_t>{5, 3}), LogicError);
}

TEST(DeviceEvents, TheReservedPeakIsTheRunningSumsHighestAndNeverBelowZero) {
  const std::vector<std::uint8_t> action{code(Name::kSegmentFree), code(Name::kSegmentAlloc), code(Name::kSegmentMap),
                                         code(Name::kSegmentUnmap), code(Name::kSegmentAlloc)};
  const std::vector<std::uint64_t> addr{9, 100, 200, 200, 100}, size{50, 30, 20, 20, 5};
  const ReservedPeak found = reserved_peak(action, addr, size);
  ASSERT_TRUE(found.peak.has_value());
  EXPECT_TRUE(*found.peak == 0);  // -50, -20, 0, -20, -15
  EXPECT_EQ(found.created, (std::vector<std::uint64_t>{100, 200}));
  EXPECT_FALSE(reserved_peak(std::vector<std::uint8_t>{code(Name::kAlloc)}, std::vector<std::uint64_t>{1},
                             std::vector<std::uint64_t>{1})
                   .peak.has_value());
}

TEST(NativeFigures, AllocationsLandInTheLastPreexistingSegmentAtOrBelowThem) {
  const std::vector<std::uint8_t> action{code(Name::kSegmentAlloc), code(Name::kAlloc), code(Name::kAlloc),
                                         code(Name::kAlloc), code(Name::kAlloc), code(Name::kAlloc)};
  const std::vector<std::uint64_t> addr{5000, 5000, 100, 150, 99, ~std::uint64_t{0}}, size{1000, 7, 3, 4, 5, 6};
  const Wide past = Wide{1} << 70;  // a segment no trace address reaches, counted all the same
  const std::vector<SegmentExtent> segments{{5000, 1000}, {100, 60}, {100, 20}, {-10, 5}, {past, 8}};
  const NativeFigures found = native_figures(action, addr, size, segments);
  ASSERT_TRUE(found.peak_reserved.has_value());
  EXPECT_TRUE(*found.peak_reserved == 1000);
  EXPECT_EQ(found.preexisting_segments, 4);  // 5000 was the trace's own
  EXPECT_TRUE(found.preexisting_bytes == 60 + 20 + 5 + 8);
  EXPECT_EQ(found.allocs_in_preexisting, 2);  // 100 and 150 in (100, 60); 99 below it, not in (-10, 5)
  EXPECT_TRUE(found.bytes_in_preexisting == 7);
  EXPECT_TRUE(found.comparable(7000));
  EXPECT_FALSE(found.comparable(6999));
  EXPECT_FALSE(native_figures(std::vector<std::uint8_t>{}, {}, {}, segments).comparable(1 << 30));
}

TEST(DeviceEvents, TheStepPeriodIsTheSmallestThatHoldsAfterTheFirstStep) {
  std::mt19937_64 rng(9);
  for (int round = 0; round < 300; ++round) {
    const std::size_t shapes = 1 + rng() % 3;
    std::vector<std::vector<std::uint64_t>> steps(1 + rng() % 9);
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const std::uint64_t shape = i == 0 ? 99 : (rng() % 4 == 0 ? rng() % 5 : i % shapes);
      steps[i] = std::vector<std::uint64_t>(1 + shape % 3, shape);
    }
    std::vector<std::uint8_t> kinds;
    std::vector<std::uint64_t> sizes;
    for (const auto& step : steps) {
      for (const std::uint64_t size : step) {
        kinds.push_back(kReplayAlloc);
        sizes.push_back(size);
        kinds.push_back(kReplayFree);
        sizes.push_back(size);
      }
      kinds.push_back(kReplayStepEnd);
      sizes.push_back(0);
    }
    const auto holds = [&](std::size_t p) {
      for (std::size_t i = 1; i + p < steps.size(); ++i) {
        if (steps[i] != steps[i + p]) return false;
      }
      return true;
    };
    std::optional<std::int64_t> expected;
    for (std::size_t p = 1; 2 * p + 1 <= steps.size() && !expected; ++p) {
      if (holds(p)) expected = static_cast<std::int64_t>(p);
    }
    EXPECT_EQ(step_period(kinds, sizes), expected) << "round " << round;
  }
}

TEST(ProfilerOrder, EventsOfOneTimestampFollowTheRunningTotal) {
  // time 5: an alloc of 4 (8 -> 12), a free of 8 (16 -> 8), an alloc of 4 (12 -> 16); then time 9.
  const std::vector<std::int64_t> time{9, 5, 5, 5}, size{2, 4, -8, 4}, total{10, 12, 8, 16};
  EXPECT_EQ(profiler_order(time, size, total), (std::vector<std::size_t>{1, 3, 2, 0}));
  // where nothing follows on, the first left of the timestamp goes next
  EXPECT_EQ(profiler_order(std::vector<std::int64_t>{1, 1}, std::vector<std::int64_t>{3, 3},
                           std::vector<std::int64_t>{100, 200}),
            (std::vector<std::size_t>{0, 1}));
  EXPECT_THROW(profiler_order(time, size, std::vector<std::int64_t>{1}), LogicError);
}

TEST(ProfilerOrder, TheTraceHasAFreeAsTwoEventsAndEachStepEndBeforeTheFirstEventAtOrAfterIt) {
  const std::vector<std::int64_t> time{9'999, 5'000, 5'000, 5'000}, size{2, 4, -8, 4}, total{10, 12, 8, 16};
  const std::vector<std::uint64_t> address{0xd, 0xa, 0xb, 0xc};
  using Kind = ProfiledEvent::Kind;
  const std::vector<ProfiledEvent> trace = profiled_trace(time, address, size, total, {12'345, 5'000, 7'000});
  const std::vector<Kind> kinds{Kind::kStepEnd, Kind::kAlloc, Kind::kAlloc, Kind::kFreeRequested,
                                Kind::kFreeCompleted, Kind::kStepEnd, Kind::kAlloc, Kind::kStepEnd};
  ASSERT_EQ(trace.size(), kinds.size());
  for (std::size_t i = 0; i < kinds.size(); ++i) EXPECT_EQ(trace[i].kind, kinds[i]) << i;
  EXPECT_EQ(trace[0].time_us, 5);   // the mark at 5,000 ns comes before the events at 5,000
  EXPECT_EQ(trace[3].address, 0xbu);
  EXPECT_EQ(trace[3].size, 8u);     // a free's size is positive
  EXPECT_EQ(trace[5].time_us, 7);
  EXPECT_EQ(trace[6].time_us, 9);   // 9,999 ns rounds down
  EXPECT_EQ(trace[7].time_us, 12);  // marks after the last event close the trace
  EXPECT_EQ(trace[7].size, 0u);
  EXPECT_THROW(profiled_trace(time, std::vector<std::uint64_t>{1}, size, total, {}), LogicError);
}

}  // namespace
}  // namespace stowage::snapshot
