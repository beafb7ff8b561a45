#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "threewalls/scenarios/routing.hpp"

using namespace threewalls::scenarios;

TEST(RoutingSampler, SameSeedSameChoicesDifferentSeedDifferent) {
  RoutingSampler a(4, 64, 6, 0.8, 0.3, 42);
  RoutingSampler b(4, 64, 6, 0.8, 0.3, 42);
  RoutingSampler c(4, 64, 6, 0.8, 0.3, 43);
  auto sa = a.next_step(64, 8, false);
  auto sb = b.next_step(64, 8, false);
  auto sc = c.next_step(64, 8, false);
  EXPECT_EQ(sa.choices, sb.choices);
  EXPECT_NE(sa.choices, sc.choices);
}

TEST(RoutingSampler, TopKExpertsOfATokenAreDistinct) {
  RoutingSampler r(2, 16, 8, 2.0, 0.0, 1);
  auto s = r.next_step(100, 10, false);
  for (const auto& layer : s.choices) {
    for (std::size_t t = 0; t < 100; ++t) {
      std::set<int> e(layer.begin() + static_cast<long>(t * 8), layer.begin() + static_cast<long>(t * 8 + 8));
      EXPECT_EQ(e.size(), 8U);
    }
  }
}

TEST(RoutingSampler, SkewConcentratesTokensOnFewExperts) {
  auto top_share = [](double skew) {
    RoutingSampler r(1, 64, 1, skew, 0.0, 7);
    auto s = r.next_step(20000, 1, false);
    auto counts = s.tokens_per_expert(0, 64);
    std::sort(counts.rbegin(), counts.rend());
    return static_cast<double>(counts[0] + counts[1] + counts[2] + counts[3]) / 20000.0;
  };
  EXPECT_NEAR(top_share(0.0), 4.0 / 64.0, 0.01);
  EXPECT_GT(top_share(1.0), 0.3);
}

TEST(RoutingSampler, LocalityKeepsPreviousDecodeChoices) {
  RoutingSampler keep(1, 64, 4, 0.0, 1.0, 3);
  auto prefill = keep.next_step(8 * 16, 8, false);
  auto d1 = keep.next_step(8, 8, true);
  auto d2 = keep.next_step(8, 8, true);
  EXPECT_EQ(d1.choices, d2.choices);
  // The first decode step continues from each sequence's last prompt token.
  std::vector<ExpertId> last(prefill.choices[0].end() - 8 * 4, prefill.choices[0].end());
  EXPECT_EQ(d1.choices[0], last);
  RoutingSampler fresh(1, 64, 4, 0.0, 0.0, 3);
  fresh.next_step(8 * 16, 8, false);
  auto f1 = fresh.next_step(8, 8, true);
  auto f2 = fresh.next_step(8, 8, true);
  EXPECT_NE(f1.choices, f2.choices);
}

TEST(RoutingSampler, ExpertIdsAboveThe16BitRangeAreKept) {
  // 40,000 experts: ids past 32,767 must come back as drawn (they once wrapped negative and
  // indexed out of bounds in tokens_per_expert).
  constexpr int kExperts = 40000;
  RoutingSampler r(1, kExperts, 3, 0.0, 0.0, 11);
  auto s = r.next_step(4000, 4000, false);
  const auto& layer = s.choices[0];
  EXPECT_GE(*std::min_element(layer.begin(), layer.end()), 0);
  EXPECT_LT(*std::max_element(layer.begin(), layer.end()), kExperts);
  EXPECT_GT(*std::max_element(layer.begin(), layer.end()), 32767);
  auto counts = s.tokens_per_expert(0, kExperts);
  long total = 0;
  for (int c : counts) total += c;
  EXPECT_EQ(total, 4000L * 3);
}
