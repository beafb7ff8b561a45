// backend/host_speed.hpp: the CPU-speed figures every real run's host probe carries.
// Checks what the figures are made of, not how fast this machine is.
#include "threewalls/backend/host_speed.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

namespace threewalls::backend {
namespace {

TEST(CpuSpeed, TheChainIsAPureFunctionOfItsSeed) {
  EXPECT_EQ(cpu_chain(1), cpu_chain(1));
  EXPECT_NE(cpu_chain(1), cpu_chain(2));
  EXPECT_NE(cpu_chain(0), 0U);  // the additive constant moves even a zero seed
}

TEST(CpuSpeed, TheWalkIsOneCycleThroughEverySlot) {
  for (const std::uint32_t lines : {2U, 3U, 17U, 1000U}) {
    const auto next = random_cycle(lines, 42);
    ASSERT_EQ(next.size(), lines);
    std::vector<bool> seen(lines, false);
    std::uint32_t at = 0;
    for (std::uint32_t i = 0; i < lines; ++i) {
      ASSERT_LT(next[at], lines);
      EXPECT_FALSE(seen[at]) << "slot " << at << " visited twice before the walk came back";
      seen[at] = true;
      at = next[at];
    }
    EXPECT_EQ(at, 0U) << lines;  // back at the start after exactly `lines` loads
  }
  EXPECT_NE(random_cycle(1000, 1), random_cycle(1000, 2));
}

TEST(CpuSpeed, EveryFigureIsPositiveAndFinite) {
  const CpuSpeed s = measure_cpu_speed(3, 4);
  for (const double v : {s.chain_us, s.copy_GBps, s.load_ns}) {
    EXPECT_TRUE(std::isfinite(v));
    EXPECT_GT(v, 0.0);
  }
}

TEST(CpuSpeed, RefusesEmptyMeasurements) {
  EXPECT_THROW((void)measure_cpu_speed(0, 4), std::invalid_argument);
  EXPECT_THROW((void)measure_cpu_speed(3, 0), std::invalid_argument);
}

}  // namespace
}  // namespace threewalls::backend
