// GradientQueue (Note [Gradients in flight]): gradients land oldest first, the bytes in flight
// are counted, and over_bound() names the fewest oldest gradients whose landing brings what stays
// within the bound; a random walk checks it against a model after every call.
#include "offload/gradient_queue.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <random>
#include <utility>

#include "base/errors.hpp"

namespace stowage::offload {
namespace {

TEST(GradientQueue, TheOldestLandFirstUntilTheRestIsWithinTheBound) {
  GradientQueue queue(100);
  EXPECT_EQ(queue.send(60), 0U);
  EXPECT_EQ(queue.over_bound(), 0U);
  EXPECT_EQ(queue.send(30), 1U);
  EXPECT_EQ(queue.send(50), 2U);
  EXPECT_EQ(queue.bytes_in_flight(), 140U);
  EXPECT_EQ(queue.over_bound(), 1U);  // 80 stay
  queue.land(0);
  EXPECT_EQ(queue.over_bound(), 0U);
  EXPECT_EQ(queue.oldest(), 1U);
  EXPECT_EQ(queue.peak_bytes_in_flight(), 140U);
  queue.check_invariants();
}

TEST(GradientQueue, OneGradientLargerThanTheBoundStaysInFlightAlone) {
  GradientQueue queue(10);
  queue.send(5);
  queue.send(500);
  EXPECT_EQ(queue.over_bound(), 1U);  // the newest alone, however large
  queue.land(0);
  EXPECT_EQ(queue.over_bound(), 0U);
  EXPECT_EQ(queue.in_flight(), 1U);
}

TEST(GradientQueue, LandingOutOfOrderIsRefusedAndChangesNothing) {
  GradientQueue queue(100);
  queue.send(10);
  queue.send(20);
  EXPECT_THROW(queue.land(1), LogicError);
  EXPECT_EQ(queue.bytes_in_flight(), 30U);
  queue.land(0);
  queue.land(1);
  EXPECT_THROW(queue.land(2), LogicError);  // none in flight
  EXPECT_FALSE(queue.oldest().has_value());
  queue.check_invariants();
}

TEST(GradientQueue, RandomWalkKeepsTheModelsAccounting) {
  std::mt19937_64 random(54);
  for (int walk = 0; walk < 50; ++walk) {
    const std::size_t bound = 1 + random() % 200;
    GradientQueue queue(bound);
    std::deque<std::pair<std::uint64_t, std::size_t>> model;  // (ticket, bytes), oldest first
    std::uint64_t next = 0;
    std::size_t peak = 0;
    for (int call = 0; call < 400; ++call) {
      const unsigned action = random() % 4;
      if (action <= 1) {
        const std::size_t bytes = random() % 80;
        EXPECT_EQ(queue.send(bytes), next);
        model.emplace_back(next++, bytes);
      } else if (action == 2 && !model.empty()) {
        queue.land(model.front().first);
        model.pop_front();
      } else {
        // land what over_bound() names, as the caller does, and check it was the fewest
        const std::size_t count = queue.over_bound();
        ASSERT_LE(count, model.size());
        std::size_t staying = 0;
        for (const auto& gradient : model) staying += gradient.second;
        for (std::size_t k = 0; k < count; ++k) staying -= model[k].second;
        EXPECT_TRUE(staying <= bound || model.size() - count == 1);
        if (count > 0) {
          EXPECT_GT(staying + model[count - 1].second, bound);
        }
        for (std::size_t k = 0; k < count; ++k) {
          queue.land(model.front().first);
          model.pop_front();
        }
      }
      std::size_t total = 0;
      for (const auto& gradient : model) total += gradient.second;
      peak = std::max(peak, total);
      ASSERT_EQ(queue.bytes_in_flight(), total);
      ASSERT_EQ(queue.in_flight(), model.size());
      ASSERT_EQ(queue.peak_bytes_in_flight(), peak);
      ASSERT_EQ(queue.oldest().has_value(), !model.empty());
      if (!model.empty()) {
        ASSERT_EQ(*queue.oldest(), model.front().first);
      }
      if (!model.empty() && random() % 8 == 0) {  // a wrong ticket never lands
        EXPECT_THROW(queue.land(model.front().first + 1 + random() % 3), LogicError);
      }
      queue.check_invariants();
    }
  }
}

}  // namespace
}  // namespace stowage::offload
