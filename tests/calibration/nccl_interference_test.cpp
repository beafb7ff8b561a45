// Compute beside resident NCCL kernels (nccl.interference, "nccl_resident_v2") and NCCL device
// memory (nccl.memory, "nccl_memory_v1"): the fits recover synthetic parameters, the profile keeps
// them through save/load, the CostModel applies them and behaves as before without them.
#include <gtest/gtest.h>

#include <cmath>

#include "test_support.hpp"
#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/fit.hpp"
#include "threewalls/calibration/models.hpp"
#include "threewalls/calibration/profile_builder.hpp"
#include "threewalls/core/error.hpp"

using namespace threewalls;
using namespace threewalls::calibration;

namespace {

// Synthetic truth: a GEMM slowdown curve per case (pending: 1.8x up to one wave falling to 1.2x at
// 2048 tiles, as measured on H200; transfer: flat 1.3x), attention 1.6x / 1.3x, memory 1.1x / 1.4x.
// 1% alternating noise, two samples per GEMM so the median per tile count is the truth.
constexpr double kTiles[] = {88.0, 112.0, 192.0, 308.0, 1024.0, 2048.0};
struct Truth {
  double gemm[2][6] = {{1.8, 1.8, 1.75, 1.7, 1.45, 1.2}, {1.3, 1.3, 1.3, 1.3, 1.3, 1.3}};
  double attention[2] = {1.6, 1.3};
  double memory[2] = {1.1, 1.4};
};

std::vector<NcclInterferenceModel::Sample> synthetic_samples(const Truth& t) {
  std::vector<NcclInterferenceModel::Sample> out;
  for (int c = 0; c <= 1; ++c) {
    for (std::size_t j = 0; j < 6; ++j) {
      const double alone = 1e-7 * kTiles[j];
      for (const double noise : {0.99, 1.01}) out.push_back({c, 0, kTiles[j], alone, alone * t.gemm[c][j] * noise});
    }
    for (const double alone : {300e-6, 700e-6}) out.push_back({c, 1, 0.0, alone, alone * t.attention[c]});
    for (const double alone : {20e-6, 150e-6}) out.push_back({c, 2, 0.0, alone, alone * t.memory[c]});
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

TEST(NcclInterferenceModel, FitKeepsTheMeasuredGemmCurveAndMedianFactors) {
  const Truth t;
  const auto m = NcclInterferenceModel::fit(synthetic_samples(t));
  ASSERT_EQ(m.cases, (std::vector<int>{0, 1}));
  ASSERT_EQ(m.gemm_tiles, std::vector<double>(std::begin(kTiles), std::end(kTiles)));
  ASSERT_EQ(m.gemm_factor.size(), 12U);
  for (int c = 0; c <= 1; ++c) {
    const auto kase = static_cast<NcclResidentCase>(c);
    for (std::size_t j = 0; j < 6; ++j) {
      EXPECT_NEAR(m.factor(kase, ComputeClass::gemm, kTiles[j]), t.gemm[c][j], 1e-9) << c << " " << kTiles[j];
    }
    EXPECT_NEAR(m.factor(kase, ComputeClass::attention, 0), t.attention[c], 1e-9);
    EXPECT_NEAR(m.factor(kase, ComputeClass::memory, 0), t.memory[c], 1e-9);
  }
}

TEST(NcclInterferenceModel, GemmSlowdownIsLinearInLogTilesBetweenKnotsAndFlatBeyond) {
  const auto m = NcclInterferenceModel::fit(synthetic_samples(Truth{}));
  const auto pending = NcclResidentCase::pending;
  // Halfway between 1024 and 2048 tiles in ln T: sqrt(1024 * 2048).
  EXPECT_NEAR(m.factor(pending, ComputeClass::gemm, std::sqrt(1024.0 * 2048.0)), (1.45 + 1.2) / 2, 1e-9);
  EXPECT_NEAR(m.factor(pending, ComputeClass::gemm, 700.0),
              1.7 + (1.45 - 1.7) * std::log(700.0 / 308) / std::log(1024.0 / 308), 1e-9);
  EXPECT_DOUBLE_EQ(m.factor(pending, ComputeClass::gemm, 8), 1.8);       // below the first knot
  EXPECT_DOUBLE_EQ(m.factor(pending, ComputeClass::gemm, 100000), 1.2);  // beyond the last
  // Unknown tiles: the median of the curve's knots.
  EXPECT_NEAR(m.factor(pending, ComputeClass::gemm, 0), (1.75 + 1.7) / 2, 1e-9);
}

TEST(NcclInterferenceModel, AnUnmeasuredCaseSlowsNothing) {
  std::vector<NcclInterferenceModel::Sample> s;
  for (const double tiles : {88.0, 112.0, 192.0, 1024.0}) s.push_back({0, 0, tiles, 1e-4, 1.3e-4});
  s.push_back({0, 1, 0, 1e-4, 1.2e-4});
  s.push_back({0, 2, 0, 1e-4, 1.0e-4});
  const auto m = NcclInterferenceModel::fit(s);
  EXPECT_NEAR(m.factor(NcclResidentCase::pending, ComputeClass::gemm, 500), 1.3, 1e-12);
  EXPECT_FALSE(m.has(NcclResidentCase::transfer));
  EXPECT_EQ(m.factor(NcclResidentCase::transfer, ComputeClass::gemm, 112), 1.0);  // not measured
}

TEST(NcclInterferenceModel, FitRefusesIncompleteOrMismatchedPoints) {
  std::vector<NcclInterferenceModel::Sample> s{{0, 0, 112, 1e-4, 2e-4}, {0, 1, 0, 1e-4, 1.5e-4}};
  EXPECT_THROW((void)NcclInterferenceModel::fit(s), FitImpossible);  // no memory-bound point
  s.push_back({0, 2, 0, 1e-4, 1.1e-4});
  EXPECT_NO_THROW((void)NcclInterferenceModel::fit(s));
  auto other = s;
  other.push_back({3, 2, 0, 1e-4, 1.1e-4});
  EXPECT_THROW((void)NcclInterferenceModel::fit(other), FitImpossible);  // unknown case
  other = s;
  other.push_back({0, 0, 0, 1e-4, 1.1e-4});
  EXPECT_THROW((void)NcclInterferenceModel::fit(other), FitImpossible);  // a GEMM without tiles
  // A second case measured at other GEMMs than the first: no common curve knots.
  other = s;
  for (const auto& x : std::vector<NcclInterferenceModel::Sample>{
           {1, 0, 224, 1e-4, 1.2e-4}, {1, 1, 0, 1e-4, 1.2e-4}, {1, 2, 0, 1e-4, 1.2e-4}}) {
    other.push_back(x);
  }
  EXPECT_THROW((void)NcclInterferenceModel::fit(other), FitImpossible);
}

TEST(NcclInterferenceModel, GroupedGemmsTakeTheirOwnCurveWhenMeasuredAndTheGemmCurveOtherwise) {
  auto s = synthetic_samples(Truth{});
  const auto without = NcclInterferenceModel::fit(s);
  EXPECT_TRUE(without.grouped_tiles.empty());
  EXPECT_DOUBLE_EQ(without.factor(NcclResidentCase::pending, ComputeClass::grouped_gemm, 700.0),
                   without.factor(NcclResidentCase::pending, ComputeClass::gemm, 700.0));
  // Grouped GEMMs measured less slowed than dense GEMMs of the same tiles (pending 1.3x at 512,
  // 1.1x at 2048; transfer flat 1.25x).
  for (int c = 0; c <= 1; ++c) {
    for (const auto& [tiles, g] :
         std::vector<std::pair<double, double>>{{512.0, c ? 1.25 : 1.3}, {2048.0, c ? 1.25 : 1.1}}) {
      for (const double noise : {0.99, 1.01}) s.push_back({c, 3, tiles, 1e-4, 1e-4 * g * noise});
    }
  }
  const auto with = NcclInterferenceModel::fit(s);
  ASSERT_EQ(with.grouped_tiles, (std::vector<double>{512.0, 2048.0}));
  const auto pending = NcclResidentCase::pending;
  EXPECT_NEAR(with.factor(pending, ComputeClass::grouped_gemm, 512.0), 1.3, 1e-9);
  EXPECT_NEAR(with.factor(pending, ComputeClass::grouped_gemm, 1024.0), 1.2, 1e-9);  // halfway in ln T
  EXPECT_NEAR(with.factor(NcclResidentCase::transfer, ComputeClass::grouped_gemm, 4096.0), 1.25, 1e-9);
  // Dense GEMMs keep their own curve.
  EXPECT_NEAR(with.factor(pending, ComputeClass::gemm, 1024.0), 1.45, 1e-9);
  // Grouped points in one case only: refused.
  auto one = synthetic_samples(Truth{});
  one.push_back({0, 3, 512.0, 1e-4, 1.3e-4});
  EXPECT_THROW((void)NcclInterferenceModel::fit(one), FitImpossible);
  one.push_back({0, 3, 0.0, 1e-4, 1.3e-4});
  EXPECT_THROW((void)NcclInterferenceModel::fit(one), FitImpossible);  // a grouped GEMM without tiles
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
  EXPECT_NEAR(cm.nccl_resident_slowdown(0, 0, 112), 1.8, 0.02);
  EXPECT_NEAR(cm.nccl_resident_slowdown(0, 0, 2048), 1.2, 0.02);
  EXPECT_NEAR(cm.nccl_resident_slowdown(0, 1, 0), 1.6, 0.02);
  EXPECT_NEAR(cm.nccl_resident_slowdown(1, 2, 0), 1.4, 0.02);
  ASSERT_TRUE(cm.nccl_memory().has_value());
  EXPECT_NEAR(cm.nccl_memory()->p2p_peer.value, 1.2e9, 0.02e9);
  EXPECT_DOUBLE_EQ(cm.nccl_resident_slowdown(0, 3, 112), cm.nccl_resident_slowdown(0, 0, 112));  // no grouped points
  EXPECT_THROW((void)cm.nccl_resident_slowdown(2, 0, 1), InputError);
  EXPECT_THROW((void)cm.nccl_resident_slowdown(0, 4, 1), InputError);
}

TEST(CostModel, GroupedInterferencePointsSurviveSaveAndLoad) {
  ProfileBuilder b({"nccl", "synthetic: unit test", "tests/calibration"}, calibration::testing::test_hardware());
  add_interference(b, Truth{});
  for (const double c : {0.0, 1.0}) {
    b.add_point(kNcclInterferenceFamily, {c, 3, 512, 1e-4}, Measurement::single(1.3e-4));
    b.add_point(kNcclInterferenceFamily, {c, 3, 2048, 4e-4}, Measurement::single(4.4e-4));
  }
  const Profile built = b.build();
  const Profile p = Profile::parse(built.to_toml(), "<nccl test>");
  EXPECT_EQ(p.to_toml(), built.to_toml());
  EXPECT_NE(p.to_toml().find("grouped_tiles = [512"), std::string::npos);
  const CostModel cm(p);
  EXPECT_NEAR(cm.nccl_resident_slowdown(0, 3, 512), 1.3, 1e-6);
  EXPECT_NEAR(cm.nccl_resident_slowdown(1, 3, 2048), 1.1, 1e-6);
  EXPECT_NEAR(cm.nccl_resident_slowdown(0, 0, 2048), 1.2, 0.02);  // dense keeps its curve
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

// Per-process device memory (device.memory, "device_memory_v1"): the same staged medians on one GPU.
TEST(DeviceMemoryModel, FitTakesTheMedianOfEachStage) {
  std::vector<DeviceMemoryModel::Sample> s;
  const double truth[DeviceMemoryModel::kStages] = {5.4e8, 8e6, 1.1e8, 3.4e7, 2.6e8, 2097152};
  for (int stage = 0; stage < DeviceMemoryModel::kStages; ++stage) {
    for (const double scale : {1.0, 1.03, 0.99}) s.push_back({stage, scale * truth[stage]});
  }
  const auto m = DeviceMemoryModel::fit(s);
  for (int stage = 0; stage < DeviceMemoryModel::kStages; ++stage) {
    EXPECT_DOUBLE_EQ(m.stage_bytes(stage), truth[stage]) << stage;
  }
  EXPECT_DOUBLE_EQ(m.context_bytes, 5.4e8);
  EXPECT_DOUBLE_EQ(m.granularity_bytes, 2097152);
  s.pop_back();
  s.pop_back();
  s.pop_back();
  EXPECT_THROW((void)DeviceMemoryModel::fit(s), FitImpossible);  // no granularity stage
  s.push_back({6, 1.0});
  EXPECT_THROW((void)DeviceMemoryModel::fit(s), FitImpossible);  // unknown stage
  EXPECT_THROW((void)DeviceMemoryModel::fit({{0, -1.0}}), FitImpossible);
}

TEST(CostModel, DeviceMemorySurvivesSaveAndLoadAndIsOptional) {
  ProfileBuilder b({"device", "synthetic: unit test", "tests/calibration"}, calibration::testing::test_hardware());
  const double truth[DeviceMemoryModel::kStages] = {5.4e8, 8e6, 1.1e8, 3.4e7, 2.6e8, 2097152};
  for (int repeat = 0; repeat < DeviceMemoryModel::kRepeats; ++repeat) {
    for (int stage = 0; stage < DeviceMemoryModel::kStages; ++stage) {
      b.add_point(kDeviceMemoryFamily, {static_cast<double>(stage), static_cast<double>(repeat), truth[stage]},
                  Measurement::single(0.1 + stage));
    }
  }
  const Profile built = b.build();
  const Profile p = Profile::parse(built.to_toml(), "<device memory test>");
  EXPECT_EQ(p.to_toml(), built.to_toml());
  EXPECT_LT(p.family(kDeviceMemoryFamily).quality.rel_err_max, 1e-6);  // errors over bytes
  const auto dm = CostModel(p).device_memory();
  ASSERT_TRUE(dm.has_value());
  EXPECT_EQ(dm->context.value, 5.4e8);
  EXPECT_EQ(dm->blas_further.value, 3.4e7);
  EXPECT_EQ(dm->cudnn.value, 2.6e8);
  EXPECT_FALSE(CostModel(calibration::testing::small_profile()).device_memory().has_value());
}

// Stages that allocate nothing (an H200 with lazy loading: the first kernel launches and the 1-byte
// cudaMalloc read 0 MiB) are measurements, not errors: the profile builds, its errors over the
// non-zero stages.
TEST(CostModel, DeviceMemoryStagesOfZeroBytesBuild) {
  ProfileBuilder b({"device", "synthetic: unit test", "tests/calibration"}, calibration::testing::test_hardware());
  const double truth[DeviceMemoryModel::kStages] = {5.49e8, 0, 1.0e8, 1.0e8, 8.0e7, 0};
  for (int repeat = 0; repeat < DeviceMemoryModel::kRepeats; ++repeat) {
    for (int stage = 0; stage < DeviceMemoryModel::kStages; ++stage) {
      b.add_point(kDeviceMemoryFamily, {static_cast<double>(stage), static_cast<double>(repeat), truth[stage]},
                  Measurement::single(0.1 + stage));
    }
  }
  const Profile p = Profile::parse(b.build().to_toml(), "<device memory zero stages>");
  EXPECT_EQ(p.family(kDeviceMemoryFamily).quality.rel_err_max, 0.0);
  const auto dm = CostModel(p).device_memory();
  ASSERT_TRUE(dm.has_value());
  EXPECT_EQ(dm->context.value, 5.49e8);
  const auto e = fit::relative_error_stats({0.0, 1.0, 2.0}, {0.0, 0.0, 1.0});
  EXPECT_EQ(e.count, 2U);  // the exact zero and 2 against 1; 1 against 0 has no relative error
  EXPECT_DOUBLE_EQ(e.max, 1.0);
  EXPECT_THROW((void)fit::relative_error_stats({1.0}, {-1.0}), std::invalid_argument);
}
