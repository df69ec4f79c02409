// The order of a step's host part and what makes it whole (Note [Whole steps]): which buckets are
// updated and written back, in which order, in each update mode; a part that throws runs again
// and the others still run, the first error rethrown after the last; a second error ends the step
// where it stands.
#include "offload/step_order.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace stowage::offload {
namespace {

using Points = std::vector<std::string>;

// A SlotBook of `buckets` buckets of one slot each, every gradient arrived; and StepWork that
// records what it does, updating through the book as the optimizer does, optionally throwing
// at the `fail_at`-th point (1-based) it passes.
struct Recorded {
  SlotBook book;
  Points done;
  Points points;
  std::size_t fail_at = 0;
  StepWork work;

  Recorded(UpdateMode mode, std::size_t buckets) : book(mode) {
    for (std::size_t bucket = 0; bucket < buckets; ++bucket) {
      book.add_bucket(1);
      book.arrive(bucket, 0);
    }
    work.update = [this](std::size_t bucket) {
      done.push_back("update " + std::to_string(bucket));
      book.submitted(bucket);
    };
    work.write_back = [this](std::size_t bucket) {
      done.push_back("write_back " + std::to_string(bucket));
      book.clear_update(bucket);
    };
    work.end = [this] {
      done.emplace_back("end");
      if (book.mode() == UpdateMode::kDelayed) book.hold_pending();
      book.end_step();
    };
    work.at_point = [this](const std::string& name) {
      points.push_back(name);
      if (points.size() == fail_at) throw std::runtime_error("failed at " + name);
    };
  }
};

TEST(StepOrder, ExactUpdatesEveryBucketThenWritesEachBackThenEnds) {
  Recorded step(UpdateMode::kExact, 2);
  run_step(step.book, step.work);
  EXPECT_EQ(step.done, (Points{"update 0", "update 1", "write_back 0", "write_back 1", "end"}));
  EXPECT_EQ(step.points, step.done);
  EXPECT_TRUE(step.book.provisional().empty());
  step.book.check_invariants();
}

// An optimizer whose parameters all live elsewhere (the device share, the host) has no bucket and
// a ring of no slot: its step is its end alone.
TEST(StepOrder, StagedStepWithoutBucketsIsItsEndAlone) {
  Recorded step(UpdateMode::kExact, 0);
  run_staged_step(step.book, step.work, 0);
  EXPECT_EQ(step.done, (Points{"end"}));
  Recorded some(UpdateMode::kExact, 1);
  EXPECT_THROW(run_staged_step(some.book, some.work, 0), std::exception);
}

// Note [Staged buckets]: a bucket's ring slot is free again before the update that takes it next.
TEST(StepOrder, StagedBucketsAreWrittenBackAsSoonAsTheRingNeedsTheirSlot) {
  Recorded step(UpdateMode::kExact, 5);
  run_staged_step(step.book, step.work, 3);
  EXPECT_EQ(step.done, (Points{"update 0", "update 1", "write_back 0", "update 2", "write_back 1", "update 3",
                               "write_back 2", "update 4", "write_back 3", "write_back 4", "end"}));
  EXPECT_EQ(step.points, step.done);
  for (const std::size_t slots : {1U, 2U, 3U}) {
    for (const std::size_t buckets : {1U, 2U, 3U, 7U}) {
      Recorded ring(UpdateMode::kExact, buckets);
      run_staged_step(ring.book, ring.work, slots);
      ASSERT_EQ(ring.done.size(), 2 * buckets + 1);
      // In flight at each update: the buckets updated and not yet written back, at most the slots.
      std::size_t in_flight = 0;
      for (const std::string& done : ring.done) {
        if (done.starts_with("update")) {
          EXPECT_LE(++in_flight, slots) << slots << " slots, " << buckets << " buckets";
        }
        if (done.starts_with("write_back")) --in_flight;
      }
      EXPECT_EQ(in_flight, 0U);
      EXPECT_EQ(ring.done.back(), "end");
    }
  }
}

TEST(StepOrder, AnErrorAtAnyPointOfAStagedStepFinishesItAndIsRaisedAfterIt) {
  for (std::size_t fail_at = 1; fail_at <= 7; ++fail_at) {
    Recorded step(UpdateMode::kExact, 3);
    step.fail_at = fail_at;
    EXPECT_THROW(run_staged_step(step.book, step.work, 2), std::runtime_error) << fail_at;
    EXPECT_EQ(step.done, (Points{"update 0", "write_back 0", "update 1", "write_back 1", "update 2", "write_back 2",
                                 "end"}))
        << fail_at;
    EXPECT_EQ(step.points.size(), 8U) << fail_at;
  }
}

// Note [Overlapped steps]: a bucket lands right after its write-back part ends, once, before any
// later part runs; also when a part threw and ran again.
TEST(StepOrder, EachBucketLandsOnceRightAfterItsWriteBack) {
  for (std::size_t fail_at = 0; fail_at <= 7; ++fail_at) {
    Recorded step(UpdateMode::kExact, 3);
    step.fail_at = fail_at;
    step.work.landed = [&step](std::size_t bucket) { step.done.push_back("landed " + std::to_string(bucket)); };
    try {
      run_staged_step(step.book, step.work, 2);
      EXPECT_EQ(fail_at, 0U);
    } catch (const std::runtime_error&) {
      EXPECT_NE(fail_at, 0U);
    }
    EXPECT_EQ(step.done, (Points{"update 0", "write_back 0", "landed 0", "update 1", "write_back 1", "landed 1",
                                 "update 2", "write_back 2", "landed 2", "end"}))
        << fail_at;
  }
}

TEST(StepOrder, ABucketUpdatedInBackwardIsNotUpdatedAgain) {
  Recorded step(UpdateMode::kInBackward, 2);
  step.book.submitted(1);  // updated as its gradients arrived
  run_step(step.book, step.work);
  EXPECT_EQ(step.done, (Points{"update 0", "write_back 0", "write_back 1", "end"}));
  EXPECT_EQ(step.points, (Points{"update 0", "update 1", "write_back 0", "write_back 1", "end"}));
}

TEST(StepOrder, DelayedUpdatesNowAndWritesBackAtTheNextStep) {
  Recorded step(UpdateMode::kDelayed, 2);
  run_step(step.book, step.work);
  EXPECT_EQ(step.done, (Points{"update 0", "update 1", "end"}));
  EXPECT_EQ(step.book.pending_buckets(), (std::vector<std::size_t>{0, 1}));
  step.done.clear();
  step.points.clear();
  run_pending_write_backs(step.book, step.work);
  EXPECT_EQ(step.done, (Points{"write_back 0", "write_back 1"}));
  EXPECT_EQ(step.points, step.done);
}

TEST(StepOrder, AnErrorAtAnyPointFinishesTheStepAndIsRaisedAfterIt) {
  for (std::size_t fail_at = 1; fail_at <= 5; ++fail_at) {
    Recorded step(UpdateMode::kExact, 2);
    step.fail_at = fail_at;
    EXPECT_THROW(run_step(step.book, step.work), std::runtime_error) << fail_at;
    // Every part ran to its end once: the one that threw resumed (its point passed twice).
    EXPECT_EQ(step.done, (Points{"update 0", "update 1", "write_back 0", "write_back 1", "end"})) << fail_at;
    EXPECT_EQ(step.points.size(), 6U) << fail_at;
    EXPECT_TRUE(step.book.provisional().empty()) << fail_at;
  }
}

TEST(StepOrder, TheFirstErrorIsTheOneRaised) {
  Recorded step(UpdateMode::kExact, 2);
  Points thrown;  // each of two points throws the first time it is passed
  step.work.at_point = [&](const std::string& name) {
    if ((name == "update 1" || name == "end") && std::find(thrown.begin(), thrown.end(), name) == thrown.end()) {
      thrown.push_back(name);
      throw std::runtime_error(name);
    }
  };
  try {
    run_step(step.book, step.work);
    FAIL() << "no error";
  } catch (const std::runtime_error& error) {
    EXPECT_EQ(std::string(error.what()), "update 1");
  }
  EXPECT_EQ(step.done, (Points{"update 0", "update 1", "write_back 0", "write_back 1", "end"}));
  EXPECT_EQ(thrown, (Points{"update 1", "end"}));
}

TEST(StepOrder, ASecondErrorInThePartThatThrewEndsTheStepThere) {
  Recorded step(UpdateMode::kExact, 2);
  step.work.write_back = [](std::size_t) { throw std::runtime_error("stuck"); };
  EXPECT_THROW(run_step(step.book, step.work), std::runtime_error);
  EXPECT_EQ(step.done, (Points{"update 0", "update 1"}));  // neither the other write-back nor the end
}

}  // namespace
}  // namespace stowage::offload
