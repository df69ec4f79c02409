// Note [Bounded waits]: a wait for copies that never complete ends at its deadline with an error
// naming what it waited for, a wait the user interrupts (SIGINT) ends at once and still runs the
// handler installed before, and the copies go on after either; under an InterruptHold the wait
// outlasts the interrupt.
#include "base/bounded_wait.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "base/interrupt_watch.hpp"
#include "device/host/host_backend.hpp"
#include "offload/compute_timeline.hpp"
#include "offload/transfer_engine.hpp"
#include "tests/support/gate.hpp"

namespace stowage {
namespace {

using namespace std::chrono_literals;
using testing::Gate;

constexpr WaitLimits kShort{/*floor_bytes_per_second=*/1e9, /*slack=*/20ms};

HostBackendOptions device_options() {
  HostBackendOptions options;
  options.capacity_bytes = 64 * kMiB;
  return options;
}

// A copy that cannot start until release(): a device stuck behind its compute.
class StuckCopy {
 public:
  explicit StuckCopy(const WaitLimits& limits) : engine_(backend_, limits) {
    backend_.enqueue_host_function(compute_, gate_.blocker());
    const Event produced = engine_.borrow_event();
    backend_.record_event(produced, compute_);
    copy_ = engine_.copy(TransferDirection::kToHost, target_.data(), source_.data(), kMiB, produced);
    engine_.recycle_event(produced);
  }
  ~StuckCopy() {
    release();
    engine_.synchronize();
    backend_.destroy_stream(compute_);
  }
  void release() {
    if (!released_) gate_.open();
    released_ = true;
  }
  TransferEngine& engine() { return engine_; }
  const TransferHandle& copy() const { return copy_; }
  HostBackend& backend() { return backend_; }
  const std::vector<std::uint8_t>& target() const { return target_; }

 private:
  HostBackend backend_{device_options()};
  TransferEngine engine_;
  Stream compute_ = backend_.create_stream();
  Gate gate_;
  bool released_ = false;
  std::vector<std::uint8_t> source_ = std::vector<std::uint8_t>(kMiB, 1);
  std::vector<std::uint8_t> target_ = std::vector<std::uint8_t>(kMiB, 0);
  TransferHandle copy_;
};

TEST(BoundedWait, TheDeadlineGrowsWithTheBytesAtTheFloorBandwidth) {
  const WaitLimits defaults;
  EXPECT_EQ(defaults.deadline(0), kWaitSlack);
  EXPECT_EQ(defaults.deadline(100'000'000), kWaitSlack + 10s) << "100 MB at 10 MB/s";
  EXPECT_GT(defaults.deadline(~std::size_t{0}), defaults.deadline(1) ) << "stays finite and ordered";
}

TEST(BoundedWait, AWaitForACopyThatNeverCompletesEndsAtItsDeadlineNamingIt) {
  StuckCopy stuck(kShort);
  const auto start = std::chrono::steady_clock::now();
  try {
    stuck.engine().wait(stuck.copy(), "a test's offload");
    FAIL() << "the wait returned";
  } catch (const WaitTimeout& error) {
    const std::string message = error.message();
    EXPECT_NE(message.find("a test's offload (device to host)"), std::string::npos) << message;
    EXPECT_NE(message.find("1.00 MiB"), std::string::npos) << message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_THROW(stuck.engine().synchronize("the step's copies"), WaitTimeout);
  EXPECT_FALSE(stuck.engine().done(stuck.copy()));
  // The copy goes on once the device does: the transfer is still the engine's, and completes.
  stuck.release();
  stuck.engine().wait(stuck.copy());
  EXPECT_EQ(stuck.target(), std::vector<std::uint8_t>(kMiB, 1));
}

TEST(BoundedWait, ACpuModeReloadWaitIsBoundedToo) {
  StuckCopy stuck(kShort);
  HostThreadTimeline compute(stuck.backend(), kShort);
  const Event arrival = stuck.engine().borrow_event();
  EXPECT_THROW(compute.wait(stuck.copy()->finished(), arrival, {"a buffer", kMiB}), WaitTimeout);
  stuck.engine().recycle_event(arrival);
}

std::atomic<int> previous_handler_calls{0};
void previous_handler(int) { previous_handler_calls.fetch_add(1); }

TEST(BoundedWait, SigintEndsAWaitAtOnceAndStillRunsTheHandlerBeforeIt) {
  struct sigaction mine {};
  mine.sa_handler = &previous_handler;
  struct sigaction saved {};
  ASSERT_EQ(::sigaction(SIGINT, &mine, &saved), 0);
  {
    StuckCopy stuck(WaitLimits{});  // a deadline of 10 s: the interrupt must come first
    std::thread interrupter([] {
      std::this_thread::sleep_for(50ms);
      ::kill(::getpid(), SIGINT);
    });
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(stuck.engine().synchronize(), Interrupted);
    interrupter.join();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
    EXPECT_EQ(previous_handler_calls.load(), 1);
  }
  struct sigaction after {};
  ASSERT_EQ(::sigaction(SIGINT, nullptr, &after), 0);
  EXPECT_EQ(after.sa_handler, &previous_handler) << "the handler before the wait is back";
  ::sigaction(SIGINT, &saved, nullptr);
}

TEST(BoundedWait, UnderAnInterruptHoldAWaitOutlastsSigintAndTheHandlerStillRuns) {
  previous_handler_calls.store(0);
  struct sigaction mine {};
  mine.sa_handler = &previous_handler;
  struct sigaction saved {};
  ASSERT_EQ(::sigaction(SIGINT, &mine, &saved), 0);
  {
    StuckCopy stuck(WaitLimits{});
    std::thread interrupter([&] {
      std::this_thread::sleep_for(50ms);
      ::kill(::getpid(), SIGINT);
      std::this_thread::sleep_for(100ms);
      stuck.release();  // the copy completes after the interrupt
    });
    {
      const InterruptHold hold;
      EXPECT_TRUE(InterruptHold::active());
      EXPECT_NO_THROW(stuck.engine().synchronize());
    }
    EXPECT_FALSE(InterruptHold::active());
    interrupter.join();
    EXPECT_EQ(stuck.target()[0], 1) << "the wait ended with the copy done";
    EXPECT_EQ(previous_handler_calls.load(), 1);
  }
  ::sigaction(SIGINT, &saved, nullptr);
}

TEST(BoundedWait, AnInterruptHoldIsTheCallingThreadsAlone) {
  const InterruptHold hold;
  bool elsewhere = true;
  std::thread other([&] { elsewhere = InterruptHold::active(); });
  other.join();
  EXPECT_TRUE(InterruptHold::active());
  EXPECT_FALSE(elsewhere);
}

TEST(BoundedWait, WithoutAHandlerSigintKeepsItsDefault) {
  struct sigaction saved {};
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  ASSERT_EQ(::sigaction(SIGINT, &default_action, &saved), 0);
  {
    const InterruptWatch watch;
    struct sigaction during {};
    ASSERT_EQ(::sigaction(SIGINT, nullptr, &during), 0);
    EXPECT_EQ(during.sa_handler, SIG_DFL) << "a plain C++ program still ends on Ctrl-C";
    EXPECT_FALSE(watch.interrupted());
  }
  ::sigaction(SIGINT, &saved, nullptr);
}

}  // namespace
}  // namespace stowage
