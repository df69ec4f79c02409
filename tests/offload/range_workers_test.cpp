// The kernel's kept threads: every part runs exactly once per job, jobs of different sizes follow
// one another, and jobs from several callers are served without mixing their parts.
#include "offload/range_workers.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace stowage::offload {
namespace {

TEST(RangeWorkers, RunsEachPartOnceForJobsOfChangingSize) {
  RangeWorkers workers;
  for (std::size_t parts : {1u, 4u, 2u, 7u, 3u, 1u, 5u}) {
    std::vector<std::atomic<int>> calls(parts);
    workers.run(parts, [&](std::size_t part) { calls[part].fetch_add(1); });
    for (std::size_t part = 0; part < parts; ++part) EXPECT_EQ(calls[part].load(), 1) << parts << " " << part;
  }
}

TEST(RangeWorkers, PartZeroRunsOnTheCaller) {
  RangeWorkers workers;
  std::thread::id caller = std::this_thread::get_id(), seen;
  std::atomic<int> elsewhere = 0;
  workers.run(3, [&](std::size_t part) {
    if (part == 0) {
      seen = std::this_thread::get_id();
    } else if (std::this_thread::get_id() != caller) {
      elsewhere.fetch_add(1);
    }
  });
  EXPECT_EQ(seen, caller);
  EXPECT_EQ(elsewhere.load(), 2);
}

TEST(RangeWorkers, CallersOnSeveralThreadsGetTheirOwnPartsDone) {
  RangeWorkers workers;
  constexpr std::size_t kCallers = 4;
  constexpr int kJobs = 200;
  std::vector<std::atomic<long>> sums(kCallers);
  std::vector<std::jthread> callers;
  for (std::size_t c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int job = 0; job < kJobs; ++job) {
        const std::size_t parts = 1 + (static_cast<std::size_t>(job) + c) % 4;
        std::atomic<long> sum = 0;
        workers.run(parts, [&](std::size_t part) { sum.fetch_add(static_cast<long>(part) + 1); });
        const long expected = static_cast<long>(parts * (parts + 1) / 2);
        if (sum.load() != expected) sums[c].fetch_add(1);
      }
    });
  }
  callers.clear();
  for (std::size_t c = 0; c < kCallers; ++c) EXPECT_EQ(sums[c].load(), 0) << "caller " << c << " saw a job with wrong parts";
}

}  // namespace
}  // namespace stowage::offload
