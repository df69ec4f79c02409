// The offloaded optimizer's step bookkeeping (Note [Offloaded optimizer semantics]): arrivals and
// bucket readiness, the slots an update covers, provisional and pending updates, the staging
// buffer delayed updates alternate, and what a skipped or finished step forgets.
#include "offload/slot_book.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "base/errors.hpp"

namespace stowage::offload {
namespace {

using Slots = std::vector<std::size_t>;

TEST(SlotBook, NumbersSlotsInBucketOrder) {
  SlotBook book(UpdateMode::kExact);
  EXPECT_EQ(book.add_bucket(2), 0U);
  EXPECT_EQ(book.add_bucket(3), 1U);
  EXPECT_EQ(book.slot_count(), 5U);
  EXPECT_EQ(book.bucket_of(1), 0U);
  EXPECT_EQ(book.bucket_of(2), 1U);
  EXPECT_EQ(book.first_slot(1), 2U);
  EXPECT_EQ(book.size(1), 3U);
  EXPECT_THROW((void)book.bucket_of(5), LogicError);
  EXPECT_THROW((void)book.add_bucket(0), LogicError);
  book.check_invariants();
}

TEST(SlotBook, ABucketIsReadyOnceEachOfItsGradientsArrivedAndCountsEachOnce) {
  SlotBook book(UpdateMode::kExact);
  book.add_bucket(2);
  book.add_bucket(1);
  EXPECT_FALSE(book.arrive(0, 3));
  EXPECT_FALSE(book.arrive(0, 4));  // copied again: still one arrival
  EXPECT_EQ(book.arrived_in(0), 1U);
  EXPECT_EQ(book.version(0), 4);
  EXPECT_TRUE(book.arrive(1, 0));
  EXPECT_TRUE(book.ready(0));
  EXPECT_FALSE(book.ready(1));
  EXPECT_EQ(book.has_gradient(0), (std::vector<bool>{true, true}));
  book.drop(1);
  book.drop(1);  // dropping what is not there changes nothing
  EXPECT_EQ(book.arrived_in(0), 1U);
  EXPECT_FALSE(book.arrived(1));
  book.check_invariants();
  book.reset_arrivals();
  EXPECT_EQ(book.arrived_in(0), 0U);
  book.check_invariants();
}

TEST(SlotBook, AnUpdateCoversTheSlotsWithAGradientOnly) {
  SlotBook book(UpdateMode::kExact);
  book.add_bucket(3);
  book.arrive(0, 0);
  book.arrive(2, 0);
  EXPECT_EQ(book.submitted(0), (Slots{0, 2}));
  EXPECT_TRUE(book.updated(0));
  EXPECT_THROW((void)book.submitted(0), LogicError);
  EXPECT_EQ(book.slots_updated(true), (Slots{0, 1, 2}));
  book.clear_update(0);
  EXPECT_FALSE(book.updated(0));
  EXPECT_TRUE(book.updated_slots(0).empty());
  book.reset_arrivals();
  EXPECT_TRUE(book.submitted(0).empty());  // nothing arrived: no update
  EXPECT_FALSE(book.updated(0));
  book.check_invariants();
}

TEST(SlotBook, InBackwardUpdatesAreProvisionalUntilTheStepEnds) {
  SlotBook book(UpdateMode::kInBackward);
  EXPECT_EQ(book.state_sets(), 2);  // provisional updates are written out of place
  EXPECT_EQ(SlotBook(UpdateMode::kExact).state_sets(), 1);
  EXPECT_EQ(SlotBook(UpdateMode::kDelayed).state_sets(), 1);
  book.add_bucket(1);
  book.add_bucket(1);
  EXPECT_TRUE(book.arrive(0, 0));
  book.submitted(0);
  EXPECT_EQ(book.provisional(), (Slots{0}));
  EXPECT_EQ(book.slots_updated(false), (Slots{1}));
  EXPECT_FALSE(book.parameters_checked());
  book.set_parameters_checked();
  book.end_step();
  EXPECT_TRUE(book.provisional().empty());
  EXPECT_FALSE(book.arrived(0));
  EXPECT_FALSE(book.parameters_checked());
  EXPECT_THROW((void)book.hold_pending(), LogicError);
  book.check_invariants();
}

TEST(SlotBook, DelayedUpdatesStayPendingAndAlternateTheStagingBuffer) {
  SlotBook book(UpdateMode::kDelayed);
  EXPECT_EQ(book.grad_buffers(), 2);
  book.add_bucket(1);
  book.add_bucket(1);
  book.arrive(1, 0);
  book.submitted(0);  // no gradient: no update
  book.submitted(1);
  EXPECT_EQ(book.hold_pending(), (Slots{1}));
  EXPECT_EQ(book.grad_buffer(), 1);
  EXPECT_TRUE(book.pending(1));
  EXPECT_TRUE(book.provisional().empty());
  book.discard_step();  // a skipped step keeps what is pending
  EXPECT_TRUE(book.updated(1));
  book.check_invariants();
  book.clear_update(1);
  book.clear_pending();
  EXPECT_FALSE(book.pending(1));
  book.check_invariants();
}

TEST(SlotBook, ASkippedStepForgetsItsUpdatesAndArrivals) {
  SlotBook book(UpdateMode::kExact);
  book.add_bucket(2);
  book.arrive(0, 0);
  book.submitted(0);
  book.discard_step();
  EXPECT_FALSE(book.updated(0));
  EXPECT_EQ(book.arrived_in(0), 0U);
  book.check_invariants();
}

TEST(SlotBook, ParsesUpdateModes) {
  EXPECT_EQ(parse_update_mode("exact"), UpdateMode::kExact);
  EXPECT_EQ(parse_update_mode("in_backward"), UpdateMode::kInBackward);
  EXPECT_EQ(parse_update_mode("delayed"), UpdateMode::kDelayed);
  EXPECT_THROW((void)parse_update_mode("later"), LogicError);
}

}  // namespace
}  // namespace stowage::offload
