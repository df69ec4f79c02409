// ParameterSchedule (Note [Parameters off the device]): which parameter copies are resident as
// units are held, prefetched and released; shared parameters have one copy; a random walk checks
// the moves against a model of the resident set after every call.
#include "offload/parameter_schedule.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "base/errors.hpp"

namespace stowage::offload {
namespace {

using Indices = std::vector<std::size_t>;

// Four units of two parameters each (parameter 2u and 2u+1), 10 bytes a parameter.
ParameterSchedule four_units(std::size_t prefetch) {
  std::vector<Indices> units;
  for (std::size_t u = 0; u < 4; ++u) units.push_back({2 * u, 2 * u + 1});
  return ParameterSchedule(std::vector<std::size_t>(8, 10), units, prefetch);
}

TEST(ParameterSchedule, FirstForwardFillsOnlyTheRunningUnit) {
  ParameterSchedule schedule = four_units(1);
  const ParameterMoves moves = schedule.hold(0, SchedulePass::kForward);
  EXPECT_EQ(moves.fill, (Indices{0, 1}));  // no order learnt yet: nothing ahead
  EXPECT_TRUE(moves.free.empty());
  EXPECT_EQ(schedule.release(0).free, (Indices{0, 1}));
  EXPECT_EQ(schedule.resident_bytes(), 0U);
  schedule.check_invariants();
}

TEST(ParameterSchedule, LearntOrderPrefetchesAheadInForwardAndBehindInBackward) {
  ParameterSchedule schedule = four_units(1);
  for (std::size_t u = 0; u < 4; ++u) {
    schedule.hold(u, SchedulePass::kForward);
    schedule.release(u);
  }
  EXPECT_EQ(schedule.order(), (Indices{0, 1, 2, 3}));
  ParameterMoves moves = schedule.hold(3, SchedulePass::kBackward);
  EXPECT_EQ(moves.fill, (Indices{6, 7, 4, 5}));  // unit 3, then unit 2 prefetched
  EXPECT_TRUE(schedule.prefetched(2));
  moves = schedule.hold(2, SchedulePass::kBackward);
  EXPECT_EQ(moves.fill, (Indices{2, 3}));  // unit 2 was in already; unit 1 comes ahead
  EXPECT_EQ(schedule.release(3).free, (Indices{6, 7}));
  EXPECT_EQ(schedule.resident_bytes(), 40U);
  moves = schedule.release_all();
  std::sort(moves.free.begin(), moves.free.end());
  EXPECT_EQ(moves.free, (Indices{2, 3, 4, 5}));
  schedule.check_invariants();

  moves = schedule.hold(0, SchedulePass::kForward);
  EXPECT_EQ(moves.fill, (Indices{0, 1, 2, 3}));
  EXPECT_EQ(schedule.peak_resident_bytes(), 60U);  // units 3 and 2 held, 1 prefetched
}

TEST(ParameterSchedule, APrefetchThatDoesNotComeTrueIsLetGo) {
  ParameterSchedule schedule = four_units(1);
  for (std::size_t u = 0; u < 4; ++u) {
    schedule.hold(u, SchedulePass::kForward);
    schedule.release(u);
  }
  schedule.hold(0, SchedulePass::kForward);  // prefetches 1
  schedule.release(0);
  const ParameterMoves moves = schedule.hold(2, SchedulePass::kForward);  // 1 skipped: 3 ahead
  EXPECT_EQ(moves.fill, (Indices{4, 5, 6, 7}));
  EXPECT_EQ(moves.free, (Indices{2, 3}));
  EXPECT_FALSE(schedule.prefetched(1));
  schedule.check_invariants();
}

TEST(ParameterSchedule, ASharedParameterHasOneCopy) {
  ParameterSchedule schedule({10, 20, 30}, {{0, 1}, {1, 2}}, 0);
  EXPECT_EQ(schedule.hold(0, SchedulePass::kForward).fill, (Indices{0, 1}));
  EXPECT_EQ(schedule.hold(1, SchedulePass::kForward).fill, (Indices{2}));
  EXPECT_EQ(schedule.resident_bytes(), 60U);
  EXPECT_EQ(schedule.release(0).free, (Indices{0}));  // 1 is still unit 1's
  EXPECT_TRUE(schedule.resident(1));
  EXPECT_EQ(schedule.release(1).free, (Indices{1, 2}));
  schedule.check_invariants();
}

TEST(ParameterSchedule, MisuseThrowsAndChangesNothing) {
  ParameterSchedule schedule = four_units(1);
  EXPECT_THROW(schedule.release(0), LogicError);
  EXPECT_THROW(schedule.hold(4, SchedulePass::kForward), LogicError);
  EXPECT_THROW(ParameterSchedule({10}, {{0, 0}}, 1), LogicError);
  EXPECT_THROW(ParameterSchedule({10}, {{1}}, 1), LogicError);
  EXPECT_EQ(schedule.resident_bytes(), 0U);
  EXPECT_TRUE(schedule.order().empty());
  schedule.check_invariants();
}

// A model of the schedule: the resident parameters are those of the held or prefetched units.
std::set<std::size_t> resident_set(const ParameterSchedule& schedule, const std::vector<Indices>& units) {
  std::set<std::size_t> resident;
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (schedule.holds(u) > 0 || schedule.prefetched(u)) resident.insert(units[u].begin(), units[u].end());
  }
  return resident;
}

TEST(ParameterSchedule, RandomWalkMovesAreExactlyTheChangesOfTheResidentSet) {
  std::mt19937 random(54);
  for (int round = 0; round < 40; ++round) {
    const std::size_t parameters = 1 + random() % 12;
    const std::size_t unit_count = 1 + random() % 6;
    const std::size_t prefetch = random() % 3;
    std::vector<std::size_t> bytes(parameters);
    for (std::size_t& b : bytes) b = 1 + random() % 100;
    std::vector<Indices> units(unit_count);
    for (Indices& unit : units) {
      for (std::size_t p = 0; p < parameters; ++p) {
        if (random() % 3 == 0) unit.push_back(p);  // shared parameters and empty units too
      }
    }
    ParameterSchedule schedule(bytes, units, prefetch);
    std::set<std::size_t> before;
    for (int step = 0; step < 300; ++step) {
      const std::size_t unit = random() % unit_count;
      const std::size_t action = random() % 10;
      ParameterMoves moves;
      if (action < 5) {
        moves = schedule.hold(unit, action < 3 ? SchedulePass::kForward : SchedulePass::kBackward);
      } else if (action < 9) {
        if (schedule.holds(unit) == 0) {
          EXPECT_THROW(schedule.release(unit), LogicError);
        } else {
          moves = schedule.release(unit);
        }
      } else {
        moves = schedule.release_all();
      }
      schedule.check_invariants();
      const std::set<std::size_t> after = resident_set(schedule, units);
      std::set<std::size_t> expected = before;
      for (const std::size_t p : moves.fill) ASSERT_TRUE(expected.insert(p).second) << "filled twice: " << p;
      for (const std::size_t p : moves.free) ASSERT_EQ(expected.erase(p), 1U) << "freed while not resident: " << p;
      ASSERT_EQ(expected, after);
      std::size_t resident_bytes = 0;
      for (const std::size_t p : after) resident_bytes += bytes[p];
      ASSERT_EQ(resident_bytes, schedule.resident_bytes());
      // The bound: the held units' bytes plus `prefetch` of the largest units.
      std::size_t held_bytes = 0;
      std::vector<std::size_t> sizes;
      for (std::size_t u = 0; u < unit_count; ++u) {
        sizes.push_back(schedule.unit_bytes(u));
        if (schedule.holds(u) > 0) held_bytes += schedule.unit_bytes(u);
      }
      std::sort(sizes.rbegin(), sizes.rend());
      std::size_t window = held_bytes;
      for (std::size_t i = 0; i < std::min(prefetch, sizes.size()); ++i) window += sizes[i];
      ASSERT_LE(schedule.resident_bytes(), window);
      before = after;
    }
  }
}

}  // namespace
}  // namespace stowage::offload
