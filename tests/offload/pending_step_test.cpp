// PendingStep (Note [Overlapped steps]): waiters are released as their bucket lands, not before;
// the work's error reaches the first wait that finds the work ended, once; many waiters on other
// threads see every landing (run under TSan: tools/build tsan).
#include "offload/pending_step.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace stowage::offload {
namespace {

// A gate the work waits at until the test opens it.
class Gate {
 public:
  void open() {
    const std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  void pass() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
};

TEST(PendingStep, AWaitReturnsOnlyOnceItsBucketHasLanded) {
  Gate first, second;
  std::atomic<int> arrivals_run{0};
  PendingStep step(2, [&](const PendingStep::Land& land) {
    first.pass();
    land(0, [&] { ++arrivals_run; });
    second.pass();
    land(1, {});
  });
  EXPECT_FALSE(step.landed(0));
  first.open();
  const PendingStep::Arrival arrival = step.wait_landed(0);
  ASSERT_TRUE(arrival);
  arrival();
  EXPECT_EQ(arrivals_run.load(), 1);
  EXPECT_TRUE(step.landed(0));
  EXPECT_FALSE(step.landed(1));  // held at the second gate
  EXPECT_FALSE(step.ended());
  second.open();
  EXPECT_FALSE(step.wait_landed(1));
  step.finish();
  EXPECT_TRUE(step.ended());
}

TEST(PendingStep, TheWorksErrorReachesTheFirstWaitThatFindsItEndedOnce) {
  PendingStep step(3, [](const PendingStep::Land& land) {
    land(0, {});
    throw std::runtime_error("bucket 1 failed");
  });
  while (!step.ended()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_THROW(step.wait_landed(2), std::runtime_error);  // never landed: the work ended with an error
  EXPECT_NO_THROW(step.wait_landed(0));                   // taken already
  EXPECT_NO_THROW(step.finish());
}

TEST(PendingStep, FinishRethrowsAnErrorNoWaitTook) {
  PendingStep step(1, [](const PendingStep::Land&) { throw std::invalid_argument("bad"); });
  EXPECT_THROW(step.finish(), std::invalid_argument);
  EXPECT_NO_THROW(step.finish());
}

TEST(PendingStep, ABucketOutsideTheStepIsRefused) {
  PendingStep step(1, [](const PendingStep::Land& land) { land(0, {}); });
  EXPECT_ANY_THROW(step.wait_landed(1));
  step.finish();
}

// Waiters on several threads, each for its own bucket, while the work lands them one by one: each
// sees its bucket landed and every bucket before it (buckets land in order).
TEST(PendingStep, WaitersOnOtherThreadsSeeEveryLandingInOrder) {
  constexpr std::size_t kBuckets = 16;
  std::vector<std::atomic<bool>> landed(kBuckets);
  PendingStep step(kBuckets, [&](const PendingStep::Land& land) {
    for (std::size_t bucket = 0; bucket < kBuckets; ++bucket) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      landed[bucket] = true;
      land(bucket, {});
    }
  });
  std::vector<std::thread> waiters;
  std::atomic<int> wrong{0};
  for (std::size_t bucket = 0; bucket < kBuckets; ++bucket) {
    waiters.emplace_back([&, bucket] {
      step.wait_landed(bucket);
      for (std::size_t earlier = 0; earlier <= bucket; ++earlier) {
        if (!landed[earlier]) ++wrong;
      }
    });
  }
  for (std::thread& waiter : waiters) waiter.join();
  step.finish();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace stowage::offload
