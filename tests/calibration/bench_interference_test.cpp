// The calibration's interference group through its report (calibration/bench/report.hpp): records
// as the GPU runner fills them (alone_s, the memory stages' bytes) give the nccl.interference and
// nccl.memory families; a one-GPU calibration says why they were not measured.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_support.hpp"
#include "threewalls/calibration/bench/plan.hpp"
#include "threewalls/calibration/bench/report.hpp"
#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/models.hpp"

using namespace threewalls;
using namespace threewalls::calibration;

// ---- through the calibration's report: records as the GPU runner fills them -> the families ----

namespace {

// The interference group's plan on 2 GPUs, measured by a synthetic GPU: pending slows GEMMs of up
// to 308 tiles x1.8 and larger ones x1.2, attention x1.6, memory-bound x1.1; transfer x1.2 everywhere; memory stages
// 300 / 900 / 1200 MB. inputs[3] (alone_s) and the memory points' bytes filled as the runner does.
std::vector<bench::Record> synthetic_interference_records() {
  bench::PlanOptions o;
  o.mode = bench::Mode::full;
  o.gpus = 2;
  o.only = {"interference"};
  std::vector<bench::Record> out;
  for (const auto& p : bench::make_plan(o)) {
    bench::Record r;
    r.point = p;
    if (p.op == "nccl_memory") {
      const double mb[3] = {300, 900, 1200};
      r.point.inputs[2] = mb[p.iparam("stage")] * 1e6;
      r.samples_s = {0.25};
    } else {
      const double alone = p.flops > 0 ? p.flops / 700e12 + 5e-6 : 3e-5;
      r.point.inputs[3] = alone;
      double f = 1.2;
      if (p.iparam("case") == 0) {
        f = p.iparam("kernel") == 0 ? (p.inputs[2] <= 308 ? 1.8 : 1.2) : p.iparam("kernel") == 1 ? 1.6 : 1.1;
      }
      r.samples_s = {alone * f * 0.995, alone * f, alone * f * 1.005};
    }
    r.status = bench::Status::ok;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

TEST(CalibrationReport, InterferenceRecordsFitBothNcclFamilies) {
  bench::BuildOptions b;
  b.info = {"synthetic", "measured", "tests/calibration"};
  b.hardware = calibration::testing::test_hardware();
  b.mode = "full";
  b.gpus_used = 2;
  const auto rep = bench::build_report(synthetic_interference_records(), b);
  const CostModel cm(rep.profile);
  ASSERT_TRUE(cm.has_nccl_interference());
  EXPECT_NEAR(cm.nccl_resident_slowdown(0, 0, 112), 1.8, 0.03);  // the measured curve, point by point
  EXPECT_NEAR(cm.nccl_resident_slowdown(0, 0, 2048), 1.2, 0.03);
  EXPECT_NEAR(cm.nccl_resident_slowdown(0, 1, 0), 1.6, 0.01);
  EXPECT_NEAR(cm.nccl_resident_slowdown(1, 2, 0), 1.2, 0.01);
  ASSERT_TRUE(cm.nccl_memory().has_value());
  EXPECT_DOUBLE_EQ(cm.nccl_memory()->communicator.value, 300e6);
  EXPECT_DOUBLE_EQ(cm.nccl_memory()->collective.value, 900e6);
  EXPECT_DOUBLE_EQ(cm.nccl_memory()->p2p_peer.value, 1200e6);
}

TEST(CalibrationReport, OneGpuSaysTheNcclFamiliesNeedTwo) {
  for (const std::string_view f : {kNcclInterferenceFamily, kNcclMemoryFamily}) {
    const std::string why = bench::why_not_measured(std::string(f), 1, "full");
    EXPECT_NE(why.find("needs 2 GPUs"), std::string::npos) << why;
  }
}
