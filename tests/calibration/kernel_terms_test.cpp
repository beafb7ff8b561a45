// kernel_terms_v1 (calibration/kernel_terms.hpp): the per-kernel shape fits of the MoE router,
// permute / unpermute, embedding, cross-entropy and Adam; their registry, fit, profile round trip
// and CostModel access.
#include "threewalls/calibration/kernel_terms.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "test_support.hpp"
#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/models.hpp"
#include "threewalls/core/error.hpp"

using namespace threewalls;
using namespace threewalls::calibration;
using namespace threewalls::calibration::testing;

namespace {

// Deterministic noise in [-amp, amp] (no std:: distribution: the same on every machine).
double noise(int i, double amp) { return amp * std::sin(12.9898 * i + 78.233 * i * i); }

// gather-sum terms (permute_bwd): per token, per gathered element, per written element.
const std::vector<std::vector<int>>& gather_factors() {
  static const std::vector<std::vector<int>> f = {{0}, {0, 1, 2}, {0, 2}};
  return f;
}

double gather_truth(double t, double k, double h) { return 3e-6 + 2e-9 * t + 1.5e-12 * t * k * h + 0.8e-12 * t * h; }

std::vector<KernelTermsModel::Sample> gather_samples(double amp) {
  std::vector<KernelTermsModel::Sample> s;
  int i = 0;
  for (double t : {300.0, 2000.0, 12000.0, 50000.0}) {
    for (double h : {1000.0, 2056.0, 7000.0}) {
      for (double k : {1.0, 4.0}) s.push_back({{t, k, h}, gather_truth(t, k, h) * (1.0 + noise(++i, amp))});
    }
  }
  return s;
}

}  // namespace

TEST(KernelTermsFamilies, EveryFamilyIsRegisteredWithItsTermsAsParameters) {
  std::set<std::string> ops;
  for (const auto& k : kernel_terms_families()) {
    EXPECT_TRUE(ops.insert(k.op).second) << "duplicate op " << k.op;
    const FamilySpec* spec = find_family_spec(k.name);
    ASSERT_NE(spec, nullptr) << k.name;
    EXPECT_EQ(spec->model, "kernel_terms_v1");
    EXPECT_EQ(spec->kind, ModelKind::kernel_terms);
    ASSERT_EQ(spec->inputs.size(), k.inputs.size());
    ASSERT_EQ(spec->params.size(), k.terms.size() + 1) << k.name;
    EXPECT_EQ(spec->params[0].key, "overhead_s");
    for (std::size_t j = 0; j < k.terms.size(); ++j) {
      EXPECT_EQ(spec->params[j + 1].key, k.terms[j].param);
      for (const int f : k.terms[j].factors) EXPECT_LT(static_cast<std::size_t>(f), k.inputs.size()) << k.name;
    }
  }
  // The op kinds the simulator costed with the pooled element-wise fit, both directions.
  for (std::string_view f : {kSoftmaxTopkFwdFamily, kSoftmaxTopkBwdFamily, kPermuteFwdFamily, kPermuteBwdFamily,
                             kUnpermuteFwdFamily, kUnpermuteBwdFamily, kEmbeddingFwdFamily, kEmbeddingBwdFamily,
                             kCrossEntropyFwdFamily, kCrossEntropyBwdFamily, kAdamStepFamily}) {
    EXPECT_NE(find_kernel_terms_family(f), nullptr) << f;
  }
}

TEST(KernelTermsModel, FitRecoversKnownParametersFromNoisyPoints) {
  const auto m = KernelTermsModel::fit(gather_factors(), gather_samples(0.01));
  ASSERT_EQ(m.coefficients_s.size(), 3U);
  EXPECT_NEAR(m.overhead_s, 3e-6, 0.3e-6);
  EXPECT_NEAR(m.coefficients_s[0], 2e-9, 0.4e-9);
  EXPECT_NEAR(m.coefficients_s[1], 1.5e-12, 0.1e-12);
  EXPECT_NEAR(m.coefficients_s[2], 0.8e-12, 0.15e-12);
  // Predictions on shapes the fit did not see, within the noise.
  for (double t : {700.0, 9000.0, 30000.0}) {
    for (double k : {2.0, 8.0}) {
      const double want = gather_truth(t, k, 4104.0);
      EXPECT_NEAR(m.time_s({t, k, 4104.0}), want, 0.02 * want) << t << " " << k;
    }
  }
}

TEST(KernelTermsModel, ExactPointsGiveExactParameters) {
  const auto m = KernelTermsModel::fit(gather_factors(), gather_samples(0.0));
  EXPECT_NEAR(m.overhead_s / 3e-6, 1.0, 1e-6);
  EXPECT_NEAR(m.coefficients_s[0] / 2e-9, 1.0, 1e-6);
  EXPECT_NEAR(m.coefficients_s[1] / 1.5e-12, 1.0, 1e-6);
  EXPECT_NEAR(m.coefficients_s[2] / 0.8e-12, 1.0, 1e-6);
}

TEST(KernelTermsModel, CoefficientsStayNonNegative) {
  // A term the data does not need (times independent of tokens x topk) is 0, never negative.
  std::vector<KernelTermsModel::Sample> s;
  for (double t : {100.0, 1000.0, 10000.0}) {
    for (double k : {1.0, 8.0}) s.push_back({{t, 64.0, k}, 2e-6 + 1e-9 * t});
  }
  const auto m = KernelTermsModel::fit({{0}, {0, 2}, {0, 1}}, s);
  for (const double c : m.coefficients_s) EXPECT_GE(c, 0.0);
  EXPECT_NEAR(m.time_s({5000.0, 64.0, 4.0}), 2e-6 + 5e-6, 1e-8);
}

TEST(KernelTermsModel, TooFewPointsOrBadTimesAreFitImpossible) {
  EXPECT_THROW((void)KernelTermsModel::fit(gather_factors(), {{{1.0, 1.0, 1.0}, 1e-6}, {{2.0, 1.0, 1.0}, 2e-6}}),
               FitImpossible);
  auto s = gather_samples(0.0);
  s[3].seconds = 0.0;
  EXPECT_THROW((void)KernelTermsModel::fit(gather_factors(), s), FitImpossible);
  EXPECT_THROW((void)KernelTermsModel::fit({{5}}, gather_samples(0.0)), FitImpossible);  // no input 5
}

namespace {

Profile profile_with_kernel_families() {
  ProfileBuilder b({"kernels", "synthetic: unit test", "tests/calibration"}, test_hardware());
  int i = 0;
  for (const auto& s : gather_samples(0.01)) {
    b.add_point(kPermuteBwdFamily, s.inputs, Measurement::from_samples({s.seconds, s.seconds * 1.01, s.seconds * 0.99}));
  }
  for (double n : {1e5, 1e6, 1e7, 1e8}) {
    b.add_point(kAdamStepFamily, {n}, Measurement::single((4e-6 + n * 30.0 / 3.0e12) * (1.0 + noise(++i, 0.01))));
  }
  return b.build();
}

}  // namespace

TEST(KernelTermsProfile, RoundTripsThroughTheFileAndFeedsTheCostModel) {
  const Profile p = profile_with_kernel_families();
  const Family* f = p.find(kPermuteBwdFamily);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->params.size(), 5U);  // t0 and four terms
  EXPECT_EQ(f->quality.loo_points, static_cast<std::int64_t>(f->points.size()));
  EXPECT_LT(f->quality.rel_err_median, 0.02);
  EXPECT_LT(f->quality.loo_rel_err_max, 0.05);
  const std::string text = p.to_toml();
  EXPECT_NE(text.find("kernel_terms_v1"), std::string::npos);
  EXPECT_NE(text.find("per_gathered_element_s"), std::string::npos);
  const Profile again = Profile::parse(text, "roundtrip.toml");
  EXPECT_EQ(again.to_toml(), text);
  const CostModel a(p), b(again);
  const std::vector<double> in{9000.0, 2.0, 4104.0};
  ASSERT_TRUE(a.fitted_kernel(kPermuteBwdFamily, in).has_value());
  EXPECT_DOUBLE_EQ(a.fitted_kernel(kPermuteBwdFamily, in)->value, b.fitted_kernel(kPermuteBwdFamily, in)->value);
  EXPECT_NEAR(a.fitted_kernel(kPermuteBwdFamily, in)->value, gather_truth(9000, 2, 4104), 0.03 * gather_truth(9000, 2, 4104));
  EXPECT_NEAR(a.fitted_kernel(kAdamStepFamily, {3e7})->value, 4e-6 + 3e7 * 30.0 / 3.0e12, 0.03 * (4e-6 + 3e7 * 10e-12));
}

TEST(KernelTermsProfile, AbsentFamilyIsEmptyAndBadCallsAreInputErrors) {
  const Profile p = profile_with_kernel_families();
  const CostModel cm(p);
  EXPECT_FALSE(cm.fitted_kernel(kSoftmaxTopkFwdFamily, {1000.0, 64.0, 8.0}).has_value());
  EXPECT_THROW((void)cm.fitted_kernel("kernel.permute", {1.0, 1.0, 1.0}), InputError);
  EXPECT_THROW((void)cm.fitted_kernel(kPermuteBwdFamily, {1.0, 1.0}), InputError);
  EXPECT_THROW((void)cm.fitted_kernel(kPermuteBwdFamily, {1.0, -1.0, 1.0}), InputError);
}

TEST(KernelTermsProfile, NegativeCoefficientInAFileIsRejectedWithItsKey) {
  std::string text = profile_with_kernel_families().to_toml();
  const auto at = text.find("per_token_s = ");
  ASSERT_NE(at, std::string::npos);
  text.insert(at + std::string("per_token_s = ").size(), "-");
  try {
    (void)Profile::parse(text, "bad.toml");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("per_token_s"), std::string::npos) << e.what();
  }
}
