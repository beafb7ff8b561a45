// Compute beside resident NCCL kernels (nccl.interference, "nccl_resident_v1") and NCCL device
// memory (nccl.memory, "nccl_memory_v1"): the fits recover synthetic parameters, the profile keeps
// them through save/load, the CostModel applies them and behaves as before without them.
#include <gtest/gtest.h>

#include <cmath>

#include "test_support.hpp"
#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/models.hpp"
#include "threewalls/calibration/profile_builder.hpp"
#include "threewalls/core/error.hpp"

using namespace threewalls;
using namespace threewalls::calibration;

namespace {

constexpr int kSms = 132;

// Synthetic truth: pending holds 24 SMs, GEMMs otherwise 1.05x slower; attention 1.6x, memory 1.1x;
// transfer holds 16 SMs, GEMM 1.2x, attention 1.3x, memory 1.4x. 1% alternating noise.
struct Truth {
  double held[2] = {24, 16};
  double gemm[2] = {1.05, 1.2};
  double attention[2] = {1.6, 1.3};
  double memory[2] = {1.1, 1.4};
};

std::vector<NcclInterferenceModel::Sample> synthetic_samples(const Truth& t) {
  std::vector<NcclInterferenceModel::Sample> out;
  int i = 0;
  auto noise = [&] { return 1.0 + ((i++ % 2) ? 0.01 : -0.01); };
  for (int c = 0; c <= 1; ++c) {
    for (const double tiles : {88.0, 112.0, 120.0, 192.0, 308.0, 1024.0, 2048.0}) {
      const double alone = 1e-6 * tiles;
      const double with = alone * t.gemm[c] * NcclInterferenceModel::wave_ratio(tiles, kSms, t.held[c]) * noise();
      out.push_back({c, 0, tiles, alone, with});
    }
    for (const double alone : {300e-6, 700e-6}) out.push_back({c, 1, 0.0, alone, alone * t.attention[c] * noise()});
    for (const double alone : {20e-6, 150e-6}) out.push_back({c, 2, 0.0, alone, alone * t.memory[c] * noise()});
  }
  return out;
}

void add_interference(ProfileBuilder& b, const Truth& t) {
  for (const auto& s : synthetic_samples(t)) {
    b.add_point(kNcclInterferenceFamily,
                {static_cast<double>(s.kase), static_cast<double>(s.kind), s.tiles, s.alone_s},
                Measurement::single(s.seconds));
  }
}

void add_memory(ProfileBuilder& b) {
  // stage, group size, bytes (two observations per stage, as two calibrations would give).
  for (const double scale : {1.0, 1.02}) {
    b.add_point(kNcclMemoryFamily, {0, 2, std::round(scale * 300e6)}, Measurement::single(0.8));
    b.add_point(kNcclMemoryFamily, {1, 2, std::round(scale * 900e6)}, Measurement::single(0.05));
    b.add_point(kNcclMemoryFamily, {2, 2, std::round(scale * 1200e6)}, Measurement::single(0.02));
  }
}

}  // namespace

TEST(NcclInterferenceModel, WaveRatioCountsTheSecondWaveOfAOneWaveGemm) {
  EXPECT_DOUBLE_EQ(NcclInterferenceModel::wave_ratio(112, 132, 24), 2.0);  // 112 > 108 SMs left
  EXPECT_DOUBLE_EQ(NcclInterferenceModel::wave_ratio(88, 132, 24), 1.0);   // still one wave
  EXPECT_DOUBLE_EQ(NcclInterferenceModel::wave_ratio(1024, 132, 24), 10.0 / 8.0);
  EXPECT_DOUBLE_EQ(NcclInterferenceModel::wave_ratio(0, 132, 24), 1.0);    // not a tiled kernel
  EXPECT_DOUBLE_EQ(NcclInterferenceModel::wave_ratio(112, 132, 0), 1.0);
}

TEST(NcclInterferenceModel, FitRecoversHeldSmsAndFactorsFromNoisyPoints) {
  const Truth t;
  const auto m = NcclInterferenceModel::fit(synthetic_samples(t), kSms);
  ASSERT_EQ(m.cases, (std::vector<int>{0, 1}));
  for (int c = 0; c <= 1; ++c) {
    const auto i = static_cast<std::size_t>(c);
    // Any H that puts the same tiles into the same waves explains the points equally: check the
    // predictions, and that the fitted H lies in the band of such H.
    for (const double tiles : {88.0, 112.0, 192.0, 308.0, 1024.0, 2048.0}) {
      const double want = t.gemm[c] * NcclInterferenceModel::wave_ratio(tiles, kSms, t.held[c]);
      EXPECT_NEAR(m.factor(static_cast<NcclResidentCase>(c), ComputeClass::gemm, tiles), want, 0.02 * want)
          << "case " << c << " tiles " << tiles;
    }
    EXPECT_GT(m.held_sms[i], 0.0) << c;
    EXPECT_NEAR(m.gemm_factor[i], t.gemm[c], 0.015) << c;
    EXPECT_NEAR(m.attention_factor[i], t.attention[c], 0.02) << c;
    EXPECT_NEAR(m.memory_factor[i], t.memory[c], 0.02) << c;
  }
}

TEST(NcclInterferenceModel, NoWaveEffectGivesZeroHeldSmsAndAPlainFactor) {
  std::vector<NcclInterferenceModel::Sample> s;
  for (const double tiles : {88.0, 112.0, 192.0, 1024.0}) s.push_back({0, 0, tiles, 1e-4, 1.3e-4});
  s.push_back({0, 1, 0, 1e-4, 1.2e-4});
  s.push_back({0, 2, 0, 1e-4, 1.0e-4});
  const auto m = NcclInterferenceModel::fit(s, kSms);
  EXPECT_EQ(m.held_sms[0], 0.0);
  EXPECT_NEAR(m.gemm_factor[0], 1.3, 1e-12);
  EXPECT_FALSE(m.has(NcclResidentCase::transfer));
  EXPECT_EQ(m.factor(NcclResidentCase::transfer, ComputeClass::gemm, 112), 1.0);  // not measured
}

TEST(NcclInterferenceModel, FitRefusesACaseWithoutEveryKernelClass) {
  std::vector<NcclInterferenceModel::Sample> s{{0, 0, 112, 1e-4, 2e-4}, {0, 1, 0, 1e-4, 1.5e-4}};
  EXPECT_THROW((void)NcclInterferenceModel::fit(s, kSms), FitImpossible);  // no memory-bound point
  s.push_back({0, 2, 0, 1e-4, 1.1e-4});
  EXPECT_NO_THROW((void)NcclInterferenceModel::fit(s, kSms));
  s.push_back({3, 2, 0, 1e-4, 1.1e-4});
  EXPECT_THROW((void)NcclInterferenceModel::fit(s, kSms), FitImpossible);  // unknown case
}

TEST(NcclMemoryModel, FitTakesTheMedianOfEachStage) {
  const auto m = NcclMemoryModel::fit({{0, 3e8}, {0, 3.2e8}, {0, 3.1e8}, {1, 9e8}, {2, 1.2e9}});
  EXPECT_DOUBLE_EQ(m.communicator_bytes, 3.1e8);
  EXPECT_DOUBLE_EQ(m.collective_bytes, 9e8);
  EXPECT_DOUBLE_EQ(m.p2p_peer_bytes, 1.2e9);
  EXPECT_THROW((void)NcclMemoryModel::fit({{0, 3e8}, {1, 9e8}}), FitImpossible);  // no p2p stage
  EXPECT_THROW((void)NcclMemoryModel::fit({{0, 3e8}, {1, 9e8}, {2, 1e9}, {5, 1.0}}), FitImpossible);
}

TEST(CostModel, NcclFamiliesSurviveSaveAndLoadAndApply) {
  ProfileBuilder b({"nccl", "synthetic: unit test", "tests/calibration"}, calibration::testing::test_hardware());
  add_interference(b, Truth{});
  add_memory(b);
  const Profile built = b.build();
  const Profile p = Profile::parse(built.to_toml(), "<nccl test>");
  EXPECT_EQ(p.to_toml(), built.to_toml());
  const Family& mem = p.family(kNcclMemoryFamily);
  EXPECT_LT(mem.quality.rel_err_max, 0.02);  // errors over bytes, not over the stages' seconds
  const CostModel cm(p);
  EXPECT_TRUE(cm.has_nccl_interference());
  EXPECT_GT(cm.nccl_resident_slowdown(0, 0, 112), 1.9);  // a one-wave GEMM needs a second wave
  EXPECT_NEAR(cm.nccl_resident_slowdown(0, 1, 0), 1.6, 0.02);
  EXPECT_NEAR(cm.nccl_resident_slowdown(1, 2, 0), 1.4, 0.02);
  ASSERT_TRUE(cm.nccl_memory().has_value());
  EXPECT_NEAR(cm.nccl_memory()->p2p_peer.value, 1.2e9, 0.02e9);
  EXPECT_THROW((void)cm.nccl_resident_slowdown(2, 0, 1), InputError);
  EXPECT_THROW((void)cm.nccl_resident_slowdown(0, 3, 1), InputError);
}

TEST(CostModel, WithoutNcclFamiliesNothingChanges) {
  const CostModel cm(calibration::testing::small_profile());
  EXPECT_FALSE(cm.has_nccl_interference());
  EXPECT_EQ(cm.nccl_resident_slowdown(0, 0, 112), 1.0);
  EXPECT_EQ(cm.nccl_resident_slowdown(1, 1, 0), 1.0);
  EXPECT_FALSE(cm.nccl_memory().has_value());
}

TEST(ProfileFormat, NcclInterferenceParametersAreChecked) {
  ProfileBuilder b({"nccl", "synthetic: unit test", "tests/calibration"}, calibration::testing::test_hardware());
  add_interference(b, Truth{});
  std::string text = b.build().to_toml();
  const auto at = text.find("cases = [0, 1]");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 14, "cases = [1, 0]");
  try {
    (void)Profile::parse(text, "bad.toml");
    FAIL() << "decreasing cases accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.toml"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cases"), std::string::npos) << e.what();
  }
}
