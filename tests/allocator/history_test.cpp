// History: a ring of events that grows as events come, up to its bound.
#include "allocator/history.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "base/errors.hpp"

namespace stowage {
namespace {

TraceEntry event(std::uintptr_t address) {
  return {TraceAction::kAlloc, address, 512, Stream{}, 1, 0};
}

std::vector<std::uintptr_t> addresses(const History& history) {
  std::vector<std::uintptr_t> out;
  for (const TraceEntry& entry : history.entries()) out.push_back(entry.address);
  return out;
}

TEST(HistoryTest, TorchsDefaultBoundKeepsEverythingWithoutReservingIt) {
  // torch.cuda.memory._record_memory_history's default max_entries is sys.maxsize: a ring sized
  // from it cannot be allocated.
  History history;
  history.enable(static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()));
  EXPECT_TRUE(history.enabled());
  for (std::uintptr_t i = 0; i < 1000; ++i) history.record(event(i));
  ASSERT_EQ(history.entries().size(), 1000u);
  EXPECT_EQ(history.entries().front().address, 0u);
  EXPECT_EQ(history.entries().back().address, 999u);
  EXPECT_EQ(history.recorded(), 1000u);
  history.enable(std::numeric_limits<std::size_t>::max());
  EXPECT_EQ(history.entries().size(), 1000u) << "a new bound keeps what was recorded";
}

TEST(HistoryTest, ABoundKeepsTheNewestAfterEveryEvent) {
  History history;
  history.enable(4);
  for (std::uintptr_t i = 0; i < 11; ++i) {
    history.record(event(i));
    const std::vector<std::uintptr_t> kept = addresses(history);
    const std::uintptr_t first = i >= 3 ? i - 3 : 0;
    ASSERT_EQ(kept.size(), i + 1 - first) << "after event " << i;
    for (std::size_t k = 0; k < kept.size(); ++k) EXPECT_EQ(kept[k], first + k);
  }
  EXPECT_EQ(history.recorded(), 11u);
  history.enable(2);
  EXPECT_EQ(addresses(history), (std::vector<std::uintptr_t>{9, 10})) << "shrinking keeps the newest";
  history.record(event(11));
  EXPECT_EQ(addresses(history), (std::vector<std::uintptr_t>{10, 11}));
  history.enable(5);
  history.record(event(12));
  EXPECT_EQ(addresses(history), (std::vector<std::uintptr_t>{10, 11, 12})) << "growing keeps all";
  history.disable();
  EXPECT_TRUE(history.entries().empty());
  EXPECT_EQ(history.recorded(), 0u);
  history.record(event(13));
  EXPECT_TRUE(history.entries().empty()) << "nothing is recorded while disabled";
}

TEST(HistoryTest, ABoundOfNothingIsRefused) {
  History history;
  EXPECT_THROW(history.enable(0), LogicError);
}

}  // namespace
}  // namespace stowage
