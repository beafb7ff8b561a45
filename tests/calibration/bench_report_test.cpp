// From records to a profile (calibration/bench/report.hpp): fits recover known parameters from
// noisy synthetic measurements, held-out points are scored through the CostModel, families that
// cannot be measured or fitted are copied from the default profile and say so, peak figures are
// compared with the reference facts (docs/architecture.md).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "default_profiles.hpp"
#include "threewalls/calibration/bench/plan.hpp"
#include "threewalls/calibration/bench/report.hpp"
#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/models.hpp"

using namespace threewalls;
using namespace threewalls::calibration;
using namespace threewalls::calibration::bench;

namespace {

Hardware h100() {
  Hardware hw = defaults::make_default_profile("h100").hardware();
  hw.gpu_name = "NVIDIA H100 80GB HBM3";
  hw.driver_version = "580.0";
  hw.gpus_seen = 4;
  hw.links_seen = {"NV18 (NVLink, 18 links): 6 GPU pairs"};
  hw.machine = "synthetic test machine";
  hw.date = "2026-11-22";
  return hw;
}

GemmModel true_gemm() {
  GemmModel m;
  m.tile_m = 128;
  m.tile_n = 128;
  m.efficiency_max = 0.82;
  m.k_half = 300.0;
  m.wave_tail = 0.13;
  m.overhead_s = 4e-6;
  m.memory_bandwidth_bytes_per_s = 2.6e12;
  m.device = {132, 989e12};
  m.elements = element_bytes(DType::bf16);
  return m;
}

CollectiveModel true_all_reduce() {
  CollectiveModel m;
  m.kind = Collective::all_reduce;
  m.groups = {{2, 9e-6, 3.3e11, 6e6, 0.55}, {3, 11e-6, 3.4e11, 8e6, 0.55}, {4, 13e-6, 3.5e11, 1e7, 0.5}};
  return m;
}

// Synthetic records for the plan's points of the families below, with 1% multiplicative noise.
std::vector<Record> synthetic(std::uint32_t seed) {
  PlanOptions o;
  o.mode = Mode::quick;
  o.gpus = 4;
  std::mt19937 gen(seed);
  std::normal_distribution<double> noise(0.0, 0.01);
  const GemmModel gemm = true_gemm();
  const CollectiveModel ar = true_all_reduce();
  std::vector<Record> out;
  for (const auto& p : make_plan(o)) {
    double t = 0.0;
    if (p.op == "gemm_bf16") {
      t = gemm.time_s(p.iparam("m"), p.iparam("n"), p.iparam("k"));
    } else if (p.op == "copy_d2d") {
      t = 3e-6 + p.bytes / 1.3e12;
    } else if (p.op == "all_reduce") {
      t = ar.time_s(p.bytes, p.group_size);
    } else if (p.op == "elementwise_add" || p.op == "elementwise_swiglu_bwd") {
      t = 1e-3 / (1.0 + p.bytes / 1e6);  // nonsense: slower for fewer bytes
    } else {
      continue;
    }
    Record r;
    r.point = p;
    for (int i = 0; i < 5; ++i) r.samples_s.push_back(t * (1.0 + noise(gen)));
    r.stop = "converged";
    r.check = "passed";
    out.push_back(std::move(r));
  }
  return out;
}

BuildOptions options(bool fill) {
  BuildOptions b;
  b.info = {"h100", "measured", "test"};
  b.hardware = h100();
  b.mode = "quick";
  if (fill) b.fill_from = {defaults::make_default_profile("h100")};
  return b;
}

const FamilyReport& family(const CalibrationReport& rep, const std::string& name) {
  for (const auto& f : rep.families) {
    if (f.name == name) return f;
  }
  throw std::runtime_error("no family " + name);
}

}  // namespace

TEST(CalibrationReport, FitsRecoverKnownModelsAndScoreHeldOutShapes) {
  const CalibrationReport rep = build_report(synthetic(1), options(false));
  const auto& g = family(rep, "gemm.bf16");
  EXPECT_TRUE(g.measured);
  EXPECT_GE(g.held_out_points, 5U);
  EXPECT_LT(g.held_out_median, 0.03);  // 1% noise
  EXPECT_LT(g.quality.loo_rel_err_median, 0.03);
  const auto& ar = family(rep, "collective.all_reduce.nvlink");
  EXPECT_GE(ar.held_out_points, 6U);  // 2 sizes x 3 group sizes
  EXPECT_LT(ar.held_out_median, 0.03);
  // The fitted parameters are near the truth.
  const Family& f = rep.profile.family("gemm.bf16");
  EXPECT_NEAR(f.param("efficiency_max"), 0.82, 0.05);
  EXPECT_EQ(rep.profile.family("copy.d2d").param_array("bandwidths_bytes_per_s").size(), 1U);
  EXPECT_NEAR(rep.profile.family("copy.d2d").param_array("bandwidths_bytes_per_s")[0], 1.3e12, 0.05e12);
  // Held-out points are not among the fitted ones, and the family's note reports their error.
  EXPECT_EQ(f.points.size(), g.fit_points);
  EXPECT_NE(f.note.find("held-out points, not fitted, predicted with median error"), std::string::npos) << f.note;
  EXPECT_TRUE(rep.profile.measured());
  // Raw samples stay in the raw output; the profile keeps the statistics.
  EXPECT_TRUE(f.points[0].time.samples_s.empty());
  EXPECT_EQ(f.points[0].time.count, 5);
}

// The norms' points (family `norm`, inputs bytes) also fit their kernel_terms family by the rows and
// hidden of their parameters: a truth that bytes alone cannot express (per-row and per-hidden costs)
// is recovered, held-out shapes are scored through CostModel::fitted_kernel, and the bytes fits stay.
TEST(CalibrationReport, NormPointsFitTheirRowsByHiddenFamily) {
  PlanOptions o;
  o.mode = Mode::full;
  o.gpus = 1;
  auto truth = [](double rows, double hidden) { return 3e-6 + 4e-9 * rows + 2.5e-12 * rows * hidden + 1.5e-9 * hidden; };
  std::mt19937 gen(7);
  std::normal_distribution<double> noise(0.0, 0.01);
  std::vector<Record> recs;
  for (const auto& p : make_plan(o)) {
    if (p.op != "norm_layernorm_fwd") continue;
    Record r;
    r.point = p;
    const double t = truth(p.param("rows"), p.param("hidden"));
    for (int i = 0; i < 5; ++i) r.samples_s.push_back(t * (1.0 + noise(gen)));
    r.stop = "converged";
    r.check = "passed";
    recs.push_back(std::move(r));
  }
  ASSERT_GE(recs.size(), 20U);
  const CalibrationReport rep = build_report(recs, options(false));
  const auto& k = family(rep, "kernel.layernorm_fwd");
  EXPECT_TRUE(k.measured);
  EXPECT_EQ(k.held_out_points, 2U);
  EXPECT_LT(k.held_out_median, 0.03);
  const CostModel cm(rep.profile);
  for (const auto& [rows, hidden] : {std::pair{16384.0, 768.0}, std::pair{1024.0, 1024.0}, std::pair{2048.0, 6144.0}}) {
    const auto t = cm.fitted_kernel("kernel.layernorm_fwd", {rows, hidden});
    ASSERT_TRUE(t.has_value());
    EXPECT_NEAR(t->value, truth(rows, hidden), 0.05 * truth(rows, hidden)) << rows << " x " << hidden;
  }
  // The bytes fits of the same points are still written (older simulators and the pooled fallback).
  EXPECT_TRUE(family(rep, "norm_layernorm_fwd").measured);
  EXPECT_TRUE(family(rep, "norm").measured);
}

TEST(CalibrationReport, UnfittableFamilyIsDroppedAndTheRestKept) {
  const CalibrationReport rep = build_report(synthetic(2), options(false));
  const auto& e = family(rep, "elementwise");
  EXPECT_FALSE(e.measured);
  EXPECT_NE(e.why.find("dropped: family elementwise: cannot fit linear_v1"), std::string::npos) << e.why;
  EXPECT_EQ(rep.profile.find("elementwise"), nullptr);
  EXPECT_NE(rep.profile.find("gemm.bf16"), nullptr);
}

TEST(CalibrationReport, FamiliesNotMeasuredAreCopiedFromTheDefaultAndSaySo) {
  const CalibrationReport rep = build_report(synthetic(3), options(true));
  const Family& fw = rep.profile.family("host.framework_op");
  EXPECT_EQ(fw.note.rfind("NOT MEASURED on this machine (an eager framework's per-op dispatch", 0), 0U) << fw.note;
  const Family& net = rep.profile.family("collective.all_reduce.network");
  EXPECT_NE(net.note.find("network-scope collectives need more than one node"), std::string::npos) << net.note;
  // The unfittable measured family is replaced by the default's, with the reason.
  const Family& ew = rep.profile.family("elementwise");
  EXPECT_NE(ew.note.find("its points could not be fitted"), std::string::npos) << ew.note;
  // Measured families are the measured ones, not the default's.
  EXPECT_EQ(rep.profile.family("gemm.bf16").note.rfind("measured by threewalls calibrate (quick)", 0), 0U);
  // Everything the simulator asks for is there: a CostModel answers for every host cost.
  const CostModel cm(rep.profile);
  EXPECT_GT(cm.framework_op().value, 0.0);
  EXPECT_GT(cm.collective(Collective::all_to_all, Bytes(1e6), 16, LinkScope::network).value, 0.0);
  // The profile survives a write/read round trip.
  const Profile back = Profile::parse(rep.profile.to_toml(), "roundtrip");
  EXPECT_EQ(back.to_toml(), rep.profile.to_toml());
  const std::string text = summary_text(rep);
  EXPECT_NE(text.find("not measured here:"), std::string::npos);
  EXPECT_NE(text.find("gemm.bf16"), std::string::npos);
}

// --fill-from: an earlier measured profile of the same kind (here: a multi-node one with its own
// network all-reduce) fills first; what it lacks comes from the default; each note names its source.
TEST(CalibrationReport, AnEarlierMeasuredProfileFillsAheadOfTheDefault) {
  const Profile def = defaults::make_default_profile("h100");
  std::vector<Family> fams;
  Family ar = def.family("collective.all_reduce.network");
  ar.note = "measured by threewalls calibrate (full) on 2 nodes";
  fams.push_back(ar);
  const Profile earlier({"h100", "measured", "earlier"}, h100(), fams);
  BuildOptions o = options(false);
  o.fill_from = {earlier, def};
  const CalibrationReport rep = build_report(synthetic(3), o);
  const Family& got = rep.profile.family("collective.all_reduce.network");
  EXPECT_NE(got.note.find("copied from " + earlier.id()), std::string::npos) << got.note;
  EXPECT_NE(got.note.find("Its note: measured by threewalls calibrate (full) on 2 nodes"), std::string::npos) << got.note;
  const Family& ag = rep.profile.family("collective.all_gather.network");
  EXPECT_NE(ag.note.find("copied from " + def.id()), std::string::npos) << ag.note;
  EXPECT_NE(family(rep, "collective.all_reduce.network").why.find(earlier.id()), std::string::npos);
  EXPECT_EQ(rep.profile.family("gemm.bf16").note.rfind("measured by threewalls calibrate (quick)", 0), 0U)
      << "measured families are never replaced";
}

TEST(CalibrationReport, PeakFiguresStandNextToTheDesignReferences) {
  const auto records = synthetic(4);
  const auto peaks = peak_figures(records, "h100");
  double best = 0.0;
  for (const auto& r : records) {
    if (r.point.op == "gemm_bf16") best = std::max(best, r.point.flops / r.median_s() / 1e12);
  }
  bool gemm = false, ar2 = false;
  for (const auto& p : peaks) {
    if (p.what == "bf16 GEMM, best grid point") {
      gemm = true;
      EXPECT_DOUBLE_EQ(p.measured, best);
      EXPECT_EQ(p.reference, 740.0);
      EXPECT_NE(p.reference_text.find("670-740 (reference facts, H100)"), std::string::npos);
      EXPECT_DOUBLE_EQ(p.ratio(), best / 740.0);
      EXPECT_EQ(p.reference_low, 670.0);
    }
    if (p.what == "NCCL all_reduce busbw at 1 GiB, 2 GPUs") {
      ar2 = true;
      EXPECT_EQ(p.reference, 0.0);  // the reference facts have no H100 NCCL figure
      EXPECT_GT(p.measured, 200.0);
    }
  }
  EXPECT_TRUE(gemm);
  EXPECT_TRUE(ar2);
  // A range counts as reached anywhere inside it; a single value within 5% either way.
  PeakFigure range{"bf16 GEMM", "TFLOP/s", 700.0, "", 740.0, 670.0, ""};
  EXPECT_EQ(range.verdict(), "within the range");
  range.measured = 640.0;
  EXPECT_EQ(range.verdict(), "within 5% of the range's low end");
  range.measured = 600.0;
  EXPECT_EQ(range.verdict(), "below 95% of the range's low end");
  range.measured = 800.0;
  EXPECT_EQ(range.verdict(), "above the reference by more than 5%");
  PeakFigure single{"busbw", "GB/s", 305.6, "", 320.0, 0.0, ""};
  EXPECT_EQ(single.verdict(), "within 5%");
  single.measured = 300.0;
  EXPECT_EQ(single.verdict(), "below 95%");
  single.reference = 0.0;
  EXPECT_EQ(single.verdict(), "");
  // H200 has NCCL references.
  for (const auto& p : peak_figures(records, "h200")) {
    if (p.what == "NCCL all_reduce busbw at 1 GiB, 4 GPUs") {
      EXPECT_EQ(p.reference, 355.0);
    }
  }
}

// --fill-from on a machine with fewer GPUs: a collective family measured here takes the larger group
// sizes' points from the earlier measured profile and fits them with its own; a synthetic profile
// lends none; the note and the summary say which sizes came from where.
TEST(CalibrationReport, LargerGroupSizesComeFromAnEarlierMeasuredProfile) {
  const CalibrationReport four = build_report(synthetic(5), options(true));  // a 4-GPU calibration
  std::vector<Record> two;
  for (const auto& r : synthetic(6)) {
    if (r.point.group_size <= 2) two.push_back(r);
  }
  BuildOptions o = options(true);
  o.gpus_used = 2;
  const CalibrationReport alone = build_report(two, o);
  EXPECT_EQ(alone.profile.family("collective.all_reduce.nvlink").param_array("group_size"), std::vector<double>{2.0});
  o.fill_from.insert(o.fill_from.begin(), four.profile);
  const CalibrationReport rep = build_report(two, o);
  const Family& ar = rep.profile.family("collective.all_reduce.nvlink");
  EXPECT_EQ(ar.param_array("group_size"), (std::vector<double>{2.0, 3.0, 4.0}));
  EXPECT_NE(ar.note.find("group sizes 3, 4 NOT MEASURED on this machine (2 GPUs)"), std::string::npos) << ar.note;
  EXPECT_NE(ar.note.find(four.profile.id()), std::string::npos) << ar.note;
  EXPECT_NE(family(rep, "collective.all_reduce.nvlink").why.find("group sizes 3, 4 from"), std::string::npos);
  EXPECT_NE(summary_text(rep).find("partly measured here"), std::string::npos);
  // The borrowed sizes predict what the 4-GPU machine measured (the synthetic truth), 2 GPUs' own.
  const CostModel cm(rep.profile);
  const CollectiveModel truth = true_all_reduce();
  for (const int n : {2, 4}) {
    const double want = truth.time_s(256e6, n);
    EXPECT_NEAR(cm.collective(Collective::all_reduce, Bytes(256e6), n, LinkScope::nvlink).value, want, 0.05 * want)
        << n;
  }
}
