// The offloaded optimizer's layout (Note [Optimizer buckets]): buckets in reverse order, split at
// a group, dtype or device change and at bucket_numel, a larger parameter alone; the device share
// by count; host bytes a parameter; the runs an update is made of.
#include "offload/adam_buckets.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "base/errors.hpp"

namespace stowage::offload {
namespace {

PlannedParameter fp32(std::int64_t numel, std::size_t group = 0) {
  return {group, ElementType::kFloat32, numel, 0};
}

TEST(PlanBuckets, TakesParametersInReverseOrderUpToTheBucketSize) {
  const std::vector<PlannedParameter> params = {fp32(10), fp32(20), fp32(30), fp32(40)};
  const std::vector<BucketPlan> buckets = plan_buckets(params, 70);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].members, (std::vector<std::size_t>{3, 2}));
  EXPECT_EQ(buckets[0].offsets, (std::vector<std::int64_t>{0, 40}));
  EXPECT_EQ(buckets[0].numel, 70);
  EXPECT_EQ(buckets[1].members, (std::vector<std::size_t>{1, 0}));
  EXPECT_EQ(buckets[1].offsets, (std::vector<std::int64_t>{0, 20}));
  EXPECT_EQ(buckets[1].numel, 30);
}

TEST(PlanBuckets, AParameterLargerThanABucketGetsOneOfItsOwn) {
  const std::vector<PlannedParameter> params = {fp32(5), fp32(100), fp32(5)};
  const std::vector<BucketPlan> buckets = plan_buckets(params, 10);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[1].members, (std::vector<std::size_t>{1}));
  EXPECT_EQ(buckets[1].numel, 100);
}

TEST(PlanBuckets, SplitsWhereTheGroupTheDtypeOrTheDeviceChanges) {
  std::vector<PlannedParameter> params = {fp32(1, 0), fp32(1, 1), fp32(1, 1), fp32(1, 1), fp32(1, 1), fp32(1, 1)};
  params[2].dtype = ElementType::kBFloat16;
  params[4].device = params[5].device = 1;
  const std::vector<BucketPlan> buckets = plan_buckets(params, 1000);
  std::vector<std::vector<std::size_t>> members;
  for (const BucketPlan& bucket : buckets) members.push_back(bucket.members);
  EXPECT_EQ(members, (std::vector<std::vector<std::size_t>>{{5, 4}, {3}, {2}, {1}, {0}}));
}

TEST(PlanBuckets, EveryParameterLandsInExactlyOneBucketContiguously) {
  std::vector<PlannedParameter> params;
  for (int i = 0; i < 50; ++i) params.push_back({static_cast<std::size_t>(i / 17), ElementType::kFloat32, 1 + i % 7, 0});
  std::vector<int> seen(params.size(), 0);
  for (const BucketPlan& bucket : plan_buckets(params, 12)) {
    std::int64_t offset = 0;
    for (std::size_t k = 0; k < bucket.members.size(); ++k) {
      ++seen[bucket.members[k]];
      EXPECT_EQ(bucket.offsets[k], offset);
      offset += params[bucket.members[k]].numel;
    }
    EXPECT_EQ(bucket.numel, offset);
    EXPECT_TRUE(bucket.numel <= 12 || bucket.members.size() == 1);
  }
  for (int count : seen) EXPECT_EQ(count, 1);
}

TEST(PlanBuckets, RefusesABucketSizeBelowOne) {
  const std::vector<PlannedParameter> params = {fp32(1)};
  EXPECT_THROW((void)plan_buckets(params, 0), LogicError);
}

TEST(KeptOnDevice, TakesTheLeadingParametersThatFitTheShareByCount) {
  const std::vector<std::int64_t> numels = {10, 20, 30, 40};
  EXPECT_EQ(kept_on_device(numels, 0.0), 0u);
  EXPECT_EQ(kept_on_device(numels, 0.1), 1u);
  EXPECT_EQ(kept_on_device(numels, 0.29), 1u);
  EXPECT_EQ(kept_on_device(numels, 0.3), 2u);
  EXPECT_EQ(kept_on_device(numels, 1.0), 4u);
  const std::vector<std::int64_t> large_first = {90, 5, 5};
  EXPECT_EQ(kept_on_device(large_first, 0.5), 0u);  // by whole parameters, from the first
  EXPECT_THROW((void)kept_on_device(numels, 1.5), LogicError);
}

TEST(BytesPerParameter, CountsStatesStagingAndTheOutputBuffer) {
  EXPECT_EQ(bytes_per_parameter(ElementType::kFloat32, 1, false, false), 16);  // 3 x 4 + 4
  EXPECT_EQ(bytes_per_parameter(ElementType::kFloat32, 2, true, false), 24);   // 4 x 4 + 2 x 4
  EXPECT_EQ(bytes_per_parameter(ElementType::kBFloat16, 1, false, false), 8);  // narrow: 4 x 2
  EXPECT_EQ(bytes_per_parameter(ElementType::kBFloat16, 1, false, true), 16);  // 12 + 2 + 2 (out)
  // in_backward's second set of states (Note [Provisional updates out of place]): the master (or a
  // narrow parameter's copy), the moments and amsgrad's maximum, twice.
  EXPECT_EQ(bytes_per_parameter(ElementType::kFloat32, 1, false, false, 2), 28);  // 2 x 3 x 4 + 4
  EXPECT_EQ(bytes_per_parameter(ElementType::kFloat32, 1, true, false, 2), 36);   // 2 x 4 x 4 + 4
  EXPECT_EQ(bytes_per_parameter(ElementType::kBFloat16, 1, false, false, 2), 14);  // 2 x 3 x 2 + 2
  EXPECT_EQ(bytes_per_parameter(ElementType::kBFloat16, 1, false, true, 2), 28);   // 2 x 12 + 2 + 2
  EXPECT_TRUE(is_narrow(ElementType::kFloat16, false));
  EXPECT_FALSE(is_narrow(ElementType::kFloat16, true));
  EXPECT_FALSE(is_narrow(ElementType::kFloat32, false));
}

TEST(BytesPerParameter, StagedBucketsKeepTorchsStatesAndAStagingBoundedByTheLargestBucket) {
  EXPECT_EQ(staged_bytes_per_parameter(ElementType::kFloat32, false, false), 8);   // two moments
  EXPECT_EQ(staged_bytes_per_parameter(ElementType::kFloat32, true, false), 12);   // and amsgrad's maximum
  EXPECT_EQ(staged_bytes_per_parameter(ElementType::kBFloat16, false, false), 4);  // narrow moments
  EXPECT_EQ(staged_bytes_per_parameter(ElementType::kFloat16, true, false), 6);
  EXPECT_EQ(staged_bytes_per_parameter(ElementType::kBFloat16, false, true), 12);  // fp32 masters and moments
  EXPECT_EQ(staging_ring_bytes(ElementType::kFloat32, 1000, 1), 8000);  // one bucket: one slot
  EXPECT_EQ(staging_ring_bytes(ElementType::kFloat32, 1000, 2), 16000);
  EXPECT_EQ(staging_ring_bytes(ElementType::kBFloat16, 1000, 3), 12000);
  EXPECT_EQ(staging_ring_bytes(ElementType::kFloat32, 1000, 1000), staging_ring_bytes(ElementType::kFloat32, 1000, 3));
}

TEST(UpdateRuns, JoinsNeighboursWithAGradientAndTheSameStep) {
  const std::vector<RunSlot> slots = {
      {0, 4, 1, true}, {4, 2, 1, true},    // one run
      {6, 3, 2, true},                     // another step: a run of its own
      {9, 1, 2, false},                    // no gradient: breaks the run
      {10, 5, 2, true}, {15, 1, 2, true},  // a run after the gap
  };
  EXPECT_EQ(update_runs(slots), (std::vector<UpdateRun>{{0, 6, 1}, {6, 9, 2}, {10, 16, 2}}));
  const std::vector<RunSlot> none = {{0, 4, 1, false}};
  EXPECT_TRUE(update_runs(none).empty());
}

}  // namespace
}  // namespace stowage::offload
