#include "threewalls/calibration/fit.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>

using namespace threewalls::calibration;

TEST(Fit, WeightedLeastSquaresRecoversLineFromNoisyData) {
  std::mt19937_64 rng(42);
  std::normal_distribution<double> noise(0.0, 0.01);
  fit::Design a;
  std::vector<double> y;
  std::vector<double> w;
  for (int i = 0; i < 50; ++i) {
    const double x = 1e3 * (i + 1);
    a.add_row({1.0, x});
    const double t = (2e-6 + x / 4e9) * (1.0 + noise(rng));
    y.push_back(t);
    w.push_back(1.0 / (t * t));
  }
  const auto sol = fit::weighted_least_squares(a, y, w);
  EXPECT_NEAR(sol[0], 2e-6, 2e-7);
  EXPECT_NEAR(1.0 / sol[1], 4e9, 1e8);
}

TEST(Fit, WeightedLeastSquaresRejectsRankDeficientDesign) {
  fit::Design a;
  a.add_row({1.0, 2.0});
  a.add_row({2.0, 4.0});
  a.add_row({3.0, 6.0});
  EXPECT_THROW(fit::weighted_least_squares(a, {1, 2, 3}, {1, 1, 1}), std::invalid_argument);
  fit::Design one;
  one.add_row({1.0, 5.0});
  EXPECT_THROW(fit::weighted_least_squares(one, {1}, {1}), std::invalid_argument);
}

TEST(Fit, NonnegativeLeastSquaresPinsNegativeCoefficientToZero) {
  // y decreases with x: the unconstrained slope is negative, the constrained one is 0 and the
  // intercept is the weighted mean.
  fit::Design a;
  std::vector<double> y;
  for (int i = 0; i < 5; ++i) {
    a.add_row({1.0, static_cast<double>(i)});
    y.push_back(5.0 - 0.5 * i);
  }
  const std::vector<double> w(5, 1.0);
  const auto free = fit::weighted_least_squares(a, y, w);
  EXPECT_LT(free[1], 0.0);
  const auto nn = fit::nonnegative_least_squares(a, y, w);
  EXPECT_EQ(nn[1], 0.0);
  EXPECT_NEAR(nn[0], 4.0, 1e-12);
}

TEST(Fit, LevenbergMarquardtRecoversExponentialDecayOnLogParameters) {
  // y = A exp(-t / tau) with A = 3, tau = 0.7, 1% noise; theta = (ln A, ln tau).
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0.0, 0.01);
  std::vector<double> t;
  std::vector<double> y;
  for (int i = 0; i < 40; ++i) {
    t.push_back(0.05 * i);
    y.push_back(3.0 * std::exp(-t.back() / 0.7) * (1.0 + noise(rng)));
  }
  auto residuals = [&](const std::vector<double>& th) {
    std::vector<double> r;
    for (std::size_t i = 0; i < t.size(); ++i) {
      r.push_back((std::exp(th[0]) * std::exp(-t[i] / std::exp(th[1])) - y[i]) / y[i]);
    }
    return r;
  };
  const auto res = fit::levenberg_marquardt_multistart(residuals, {{0.0, 0.0}, {2.0, -2.0}});
  EXPECT_TRUE(res.converged);
  EXPECT_NEAR(std::exp(res.theta[0]), 3.0, 0.05);
  EXPECT_NEAR(std::exp(res.theta[1]), 0.7, 0.02);
}

TEST(Fit, LevenbergMarquardtSurvivesNonFiniteResiduals) {
  // The residual is NaN for theta < 0: steps into that region must be rejected, not taken.
  auto residuals = [](const std::vector<double>& th) {
    return std::vector<double>{th[0] < 0 ? std::nan("") : th[0] - 2.0};
  };
  const auto res = fit::levenberg_marquardt(residuals, {5.0});
  EXPECT_NEAR(res.theta[0], 2.0, 1e-6);
}

TEST(Fit, LeaveOneOutSkipsPointsWithoutPredictionAndIsNanWithNone) {
  const std::vector<double> meas = {1.0, 2.0, 4.0};
  auto some = fit::leave_one_out(
      3, [](std::size_t i) -> std::optional<double> { return i == 1 ? std::nullopt : std::optional<double>(1.1); },
      meas);
  EXPECT_EQ(some.count, 2U);
  EXPECT_NEAR(some.max, (4.0 - 1.1) / 4.0, 1e-12);
  auto none = fit::leave_one_out(
      3, [](std::size_t) -> std::optional<double> { return std::nullopt; }, meas);
  EXPECT_EQ(none.count, 0U);
  EXPECT_TRUE(std::isnan(none.median));
  EXPECT_TRUE(std::isnan(none.max));
}

TEST(Fit, MedianAndQuantileFollowNumpyConventions) {
  EXPECT_EQ(fit::median({3, 1, 2}), 2.0);
  EXPECT_EQ(fit::median({4, 1, 2, 3}), 2.5);
  EXPECT_NEAR(fit::quantile({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.1), 1.9, 1e-12);
  EXPECT_NEAR(fit::quantile({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.9), 9.1, 1e-12);
  EXPECT_THROW(fit::median({}), std::invalid_argument);
}

TEST(Fit, RoundSignificantKeepsRequestedDigits) {
  EXPECT_EQ(fit::round_significant(1.23456789e-5, 7), 1.234568e-5);
  EXPECT_EQ(fit::round_significant(987654321.0, 3), 988000000.0);
  EXPECT_EQ(fit::round_significant(0.0, 7), 0.0);
  EXPECT_TRUE(std::isnan(fit::round_significant(std::nan(""), 7)));
}
