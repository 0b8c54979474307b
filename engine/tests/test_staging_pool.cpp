#include <gtest/gtest.h>

#include <stdexcept>

#include "activekv/staging_pool.h"

namespace activekv {
namespace {

TEST(StagingPool, ReleasedRegionIsReusedWithNewGeneration) {
  StagingPool pool(/*pin=*/false);
  const auto a = pool.acquire(1024).value();
  pool.release(a);
  const auto b = pool.acquire(512).value();
  EXPECT_EQ(b.region, a.region);
  EXPECT_GT(b.generation, a.generation);
  EXPECT_EQ(b.buffer.numel(), 512);
  EXPECT_THROW(pool.release(a), std::logic_error);  // stale lease
}

TEST(StagingPool, LeasedRegionIsNotHandedOutTwice) {
  StagingPool pool(false);
  const auto a = pool.acquire(64).value();
  const auto b = pool.acquire(64).value();
  EXPECT_NE(a.region, b.region);
  EXPECT_EQ(pool.in_use(), 2);
}

TEST(StagingPool, QuarantinedRegionIsNeverReused) {
  StagingPool pool(false);
  const auto a = pool.acquire(64).value();
  pool.quarantine(a);
  EXPECT_EQ(pool.quarantined(), 1);
  const auto b = pool.acquire(64).value();
  EXPECT_NE(b.region, a.region);
  EXPECT_THROW(pool.release(a), std::logic_error);
}

}  // namespace
}  // namespace activekv
