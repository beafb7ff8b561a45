// backend/host_speed.hpp: the CPU-speed figures every real run's host probe carries (issue 8).
// Checks what the figures are made of, not how fast this machine is.
#include "threewalls/backend/host_speed.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

namespace threewalls::backend {
namespace {

TEST(CpuSpeed, TheChainIsAPureFunctionOfItsSeed) {
  EXPECT_EQ(cpu_chain(1), cpu_chain(1));
  EXPECT_NE(cpu_chain(1), cpu_chain(2));
  EXPECT_NE(cpu_chain(0), 0U);  // the additive constant moves even a zero seed
}

TEST(CpuSpeed, BothFiguresArePositiveAndFinite) {
  const CpuSpeed s = measure_cpu_speed(3, 4);
  EXPECT_TRUE(std::isfinite(s.chain_us));
  EXPECT_GT(s.chain_us, 0.0);
  EXPECT_TRUE(std::isfinite(s.copy_GBps));
  EXPECT_GT(s.copy_GBps, 0.0);
}

TEST(CpuSpeed, RefusesEmptyMeasurements) {
  EXPECT_THROW((void)measure_cpu_speed(0, 4), std::invalid_argument);
  EXPECT_THROW((void)measure_cpu_speed(3, 0), std::invalid_argument);
}

}  // namespace
}  // namespace threewalls::backend
