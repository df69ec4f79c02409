// The cap on reserved memory: the device, a fraction of it, and a byte limit, the smallest wins.
#include "allocator/memory_limit.hpp"

#include <gtest/gtest.h>

#include <limits>

#include "base/errors.hpp"

namespace stowage {
namespace {

constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

TEST(MemoryLimit, TheSmallestCapWins) {
  MemoryLimit limit(1000, kUnlimited, 1.0);
  EXPECT_EQ(limit.bytes(), 1000u);
  limit.set_fraction(0.5);
  EXPECT_EQ(limit.bytes(), 500u);
  limit.set_bytes(300);
  EXPECT_EQ(limit.bytes(), 300u);
  limit.set_fraction(0.0);
  EXPECT_EQ(limit.bytes(), 0u) << "a fraction of 0 refuses everything, as torch allows";
}

TEST(MemoryLimit, GrowthIsAllowedUpToTheCapExactly) {
  const MemoryLimit limit(1000, 600, 1.0);
  EXPECT_TRUE(limit.allows(400, 200));
  EXPECT_FALSE(limit.allows(401, 200));
  EXPECT_FALSE(limit.allows(0, 601));
  EXPECT_FALSE(limit.allows(kUnlimited, 1)) << "no overflow";
  EXPECT_EQ(limit.room(450), 150u);
  EXPECT_EQ(limit.room(700), 0u);
}

TEST(MemoryLimit, RefusesBadSettingsByName) {
  MemoryLimit limit(1000, kUnlimited, 1.0);
  EXPECT_THROW(limit.set_fraction(1.5), LogicError);
  EXPECT_THROW(limit.set_fraction(-0.1), LogicError);
  EXPECT_THROW(limit.set_bytes(0), LogicError);
  EXPECT_EQ(limit.bytes(), 1000u) << "a refused setting changes nothing";
}

}  // namespace
}  // namespace stowage
