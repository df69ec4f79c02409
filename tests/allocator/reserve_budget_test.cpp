// Note [Reserve budget]: the headroom over the peak in use, and the allowance learned from churn.
#include "allocator/reserve_budget.hpp"

#include <gtest/gtest.h>

#include "allocator/block_cache.hpp"
#include "base/numbers.hpp"
#include "device/host/host_backend.hpp"

namespace stowage {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

class ReserveBudgetTest : public ::testing::Test {
 protected:
  ReserveBudgetTest() {
    HostBackendOptions options;
    options.synchronous = true;
    backend_ = std::make_unique<HostBackend>(options);
    cache_ = std::make_unique<BlockCache>(*backend_, stats_, trace_);
    memory_ = backend_->try_allocate_segment(256 * MiB);
    Block* block = cache_->add_segment(reinterpret_cast<std::uintptr_t>(memory_), 256 * MiB,
                                       Stream{}, SizeClass::kLarge, 0, pool_);
    cache_->index(*block);
  }

  // Makes `bytes` active (allocated), then frees them: the high water stays.
  void reach(std::size_t bytes) {
    Block* block = pool_.cached(SizeClass::kLarge).best_fit(Stream{}, bytes);
    cache_->unindex(*block);
    cache_->claim(block, bytes, bytes, true, false, 0);
    cache_->end_allocation(block, 0);
    cache_->free_after_streams(block);
  }

  std::unique_ptr<HostBackend> backend_;
  DeviceStats stats_;
  TraceRecorder trace_;
  std::unique_ptr<BlockCache> cache_;
  Pool pool_;
  void* memory_ = nullptr;
};

TEST_F(ReserveBudgetTest, AllowsTheHeadroomOverThePeakInUse) {
  reach(100 * MiB);
  const ReserveBudget budget(*cache_, 0.02, 2 * MiB);
  EXPECT_TRUE(budget.allows(102 * MiB, 0));
  EXPECT_FALSE(budget.allows(103 * MiB, 0));
  // A request larger than the peak counts with what is active now.
  EXPECT_TRUE(budget.allows(204 * MiB, 200 * MiB));
  EXPECT_FALSE(budget.unbounded());
  EXPECT_TRUE(ReserveBudget(*cache_, 1.0, 2 * MiB).unbounded());
}

TEST_F(ReserveBudgetTest, ChurnOfAnEighthOfThePeakGrowsTheAllowanceByOnePercent) {
  reach(160 * MiB);
  ReserveBudget budget(*cache_, 0.0, 2 * MiB);
  budget.note_churn(19 * MiB);
  EXPECT_EQ(budget.allowance(), 0u) << "19 MiB is less than an eighth of 160";
  budget.note_churn(1 * MiB);
  EXPECT_EQ(budget.allowance(), 2 * MiB) << "1% of 160 MiB is below the 2 MiB granule";
  EXPECT_TRUE(budget.allows(162 * MiB, 0));
  budget.note_churn(0);
  EXPECT_EQ(budget.allowance(), 2 * MiB) << "no churn, no growth";
}

TEST_F(ReserveBudgetTest, ANewPeakStartsTheChurnCountAgain) {
  reach(80 * MiB);
  ReserveBudget budget(*cache_, 0.0, MiB);
  budget.note_churn(9 * MiB);  // 8 * 9 < 80: not yet
  reach(160 * MiB);            // the peak rises: its layout is not known yet
  budget.note_churn(11 * MiB);
  EXPECT_EQ(budget.allowance(), 0u) << "the 9 MiB before the new peak no longer count";
  budget.note_churn(9 * MiB);
  EXPECT_EQ(budget.allowance(), 160 * MiB / 100);
}

}  // namespace
}  // namespace stowage
