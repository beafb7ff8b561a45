// The shipped default profiles are exactly what the generator (calibration/tools) produces.
#include "default_profiles.hpp"

#include <gtest/gtest.h>

#include "test_support.hpp"
#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/core/error.hpp"

using namespace threewalls;
using namespace threewalls::calibration;
using namespace threewalls::calibration::testing;

namespace {

// The first line where two texts differ, for a readable failure.
std::string first_difference(const std::string& a, const std::string& b) {
  std::size_t line = 1;
  std::size_t i = 0;
  std::size_t start = 0;
  for (; i < a.size() && i < b.size() && a[i] == b[i]; ++i) {
    if (a[i] == '\n') {
      ++line;
      start = i + 1;
    }
  }
  auto line_of = [&](const std::string& s) { return s.substr(start, s.find('\n', start) - start); };
  return "line " + std::to_string(line) + ":\n  committed: " + line_of(a) + "\n  generator: " + line_of(b);
}

}  // namespace

TEST(DefaultProfiles, CommittedFilesEqualTheGeneratorsOutput) {
  for (const char* kind : {"h100", "h200", "b200", "gb200"}) {
    const std::string committed = read_text(shipped_profile_path(kind));
    const std::string generated = default_profile(kind).to_toml();
    EXPECT_TRUE(committed == generated) << shipped_profile_path(kind)
                                        << " is stale; regenerate with threewalls_make_default_profiles --out-dir "
                                        << "calibration/profiles. First difference at "
                                        << first_difference(committed, generated);
  }
}

TEST(DefaultProfiles, AreLabelledSyntheticAndCoverEveryFamilyTheSimulatorNeeds) {
  for (const char* kind : {"h100", "h200", "b200", "gb200"}) {
    const Profile& p = default_profile(kind);
    EXPECT_EQ(p.info().source, defaults::kSyntheticSource);
    EXPECT_FALSE(p.measured());
    EXPECT_EQ(p.info().name, std::string("default_") + kind);
    for (const auto& spec : family_specs()) {
      if (spec.kind == ModelKind::gemm || spec.kind == ModelKind::grouped_gemm) {
        if (spec.dtype == DType::fp32) continue;  // no facts for fp32 GEMMs: documented as absent
      }
      // Measured only (the family's module says so): the simulator charges something else without it.
      if (spec.measured_only) continue;
      const Family* f = p.find(spec.name);
      ASSERT_NE(f, nullptr) << kind << " lacks " << spec.name;
      EXPECT_FALSE(f->note.empty()) << spec.name << ": every synthetic family says where its numbers come from";
    }
  }
}

TEST(DefaultProfiles, UnknownKindIsAnInputError) {
  EXPECT_THROW((void)defaults::make_default_profile("a100"), InputError);
}

// Blackwell has no measurement here: its defaults are the H200's facts scaled by datasheet ratios,
// and the profile says so in its machine line and in every family's note.
TEST(DefaultProfiles, BlackwellIsTheH200ScaledByDatasheetRatiosAndSaysItIsNotMeasured) {
  const Profile& h200 = default_profile("h200");
  for (const char* kind : {"b200", "gb200"}) {
    const Profile& p = default_profile(kind);
    EXPECT_NE(p.hardware().machine.find("NOT MEASURED"), std::string::npos) << kind;
    for (const Family& f : p.families()) EXPECT_EQ(f.note.rfind("NOT MEASURED", 0), 0U) << kind << " " << f.name;
    const double peak_ratio = p.hardware().peak_bf16_flop_per_s / h200.hardware().peak_bf16_flop_per_s;
    EXPECT_GT(peak_ratio, 2.2) << kind;
    // A large bf16 GEMM: the H200's time over the peak ratio (the same fraction of peak), within the fits.
    const CostModel a(h200), b(p);
    const double th = a.gemm(8192, 8192, 8192, DType::bf16).value, tb = b.gemm(8192, 8192, 8192, DType::bf16).value;
    EXPECT_NEAR(th / tb, peak_ratio, 0.1 * peak_ratio) << kind;
  }
}
