// The optimizer's update queue: jobs run one after another in submission order on one thread
// (not the caller's), an exception stays in its ticket, and destruction runs what was submitted.
#include "offload/update_queue.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace stowage::offload {
namespace {

void wait_done(const UpdateTicket& ticket) {
  while (!ticket.done()) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

TEST(UpdateQueue, RunsJobsInOrderOnOneThreadOfItsOwn) {
  UpdateQueue queue({});
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::vector<std::shared_ptr<UpdateTicket>> tickets;
  for (int i = 0; i < 20; ++i) {
    tickets.push_back(queue.submit([&, i] {
      if (i % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    }));
  }
  wait_done(*tickets.back());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
  for (const auto& id : threads) EXPECT_EQ(id, threads.front());
  EXPECT_NE(threads.front(), std::this_thread::get_id());
  EXPECT_GT(queue.busy_seconds(), 0.0);
}

TEST(UpdateQueue, AnExceptionStaysInItsTicketAndLaterJobsStillRun) {
  UpdateQueue queue({});
  auto failing = queue.submit([] { throw std::runtime_error("the update failed"); });
  bool ran = false;
  auto next = queue.submit([&] { ran = true; });
  wait_done(*next);
  ASSERT_TRUE(failing->done());
  EXPECT_THROW(failing->take(), std::runtime_error);
  EXPECT_NO_THROW(failing->take());  // raised once
  EXPECT_NO_THROW(next->take());
  EXPECT_TRUE(ran);
}

TEST(UpdateQueue, DestructionRunsWhatWasSubmitted) {
  int ran = 0;
  std::shared_ptr<UpdateTicket> last;
  {
    UpdateQueue queue({0});
    EXPECT_EQ(queue.threads(), 1);
    for (int i = 0; i < 5; ++i) {
      last = queue.submit([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        ++ran;
      });
    }
  }
  EXPECT_EQ(ran, 5);
  EXPECT_TRUE(last->done());
}

}  // namespace
}  // namespace stowage::offload
