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
      // Measured only (no datasheet facts): without them the simulator uses the pooled elementwise fit.
      if (spec.kind == ModelKind::kernel_terms) continue;
      // Measured only: without them the simulator charges host.kernel_launch for these calls (the
      // framework's backward op, autograd-recording op and read: host.framework_op and host.gpu_read;
      // its attention plan: nothing; its recording: host.record_op).
      if (spec.name == "host.gemm_launch" || spec.name == "host.grouped_gemm_launch" ||
          spec.name == "host.attention_launch" || spec.name == "host.attention_bwd_launch" ||
          spec.name == "host.op_dispatch" || spec.name == "host.record_op" || spec.name == "host.stream_wait" ||
          spec.name == "host.framework_backward_op" || spec.name == "host.framework_sync" ||
          spec.name == "host.framework_attention_plan" || spec.name == "host.framework_autograd_op" ||
          spec.name == "host.framework_record_op" || spec.kind == ModelKind::gemm_call ||
          spec.kind == ModelKind::grouped_call || spec.kind == ModelKind::stream_cycle) {
        continue;
      }
      // Optional, measured only (2 GPUs): without them the simulator charges no interference and uses fixed NCCL memory
      // constants.
      if (spec.kind == ModelKind::nccl_interference || spec.kind == ModelKind::nccl_memory) continue;
      // Optional, measured only: without it the memory model uses fixed constants for the CUDA context
      // and the libraries.
      if (spec.kind == ModelKind::device_memory) continue;
      // Optional, measured only: without them the simulator costs fused and decode attention from the
      // attention fits and warns.
      if (spec.kind == ModelKind::attention_fused || spec.kind == ModelKind::attention_decode) continue;
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
