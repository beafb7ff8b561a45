#include "threewalls/notebooks_export/compare.hpp"

#include <gtest/gtest.h>

#include "test_util.hpp"
#include "threewalls/core/error.hpp"

using namespace threewalls;
using namespace threewalls::notebooks_export;
using threewalls::notebooks_export::testing::synthetic;

namespace {

SyntheticSpec small(double scale = 1.0, int steps = 3) {
  SyntheticSpec s;
  s.ranks = 4;
  s.steps = steps;
  s.layers = 2;
  s.microbatches = 2;
  s.time_scale = scale;
  return s;
}

const CompareRow* row(const std::vector<CompareRow>& rows, const std::string& phase) {
  for (const auto& r : rows) {
    if (r.phase == phase) return &r;
  }
  return nullptr;
}

}  // namespace

TEST(Compare, IdenticalRunsHaveZeroErrorEverywhere) {
  auto a = synthetic(small(), "_a");
  auto b = synthetic(small(), "_b");
  auto r = compare_runs(a, b);
  EXPECT_EQ(r.matched, a.phases.size());
  EXPECT_TRUE(r.only_in_a.empty());
  EXPECT_TRUE(r.only_in_b.empty());
  ASSERT_TRUE(r.step_time_error_pct.has_value());
  EXPECT_NEAR(*r.step_time_error_pct, 0.0, 1e-9);
  for (const auto& row : r.by_phase) {
    ASSERT_TRUE(row.median_error_pct.has_value()) << row.phase;
    EXPECT_NEAR(*row.median_error_pct, 0.0, 1e-9) << row.phase;
  }
  EXPECT_FALSE(r.failed());
}

TEST(Compare, ATenPercentSlowerRunShowsTenPercentPerPhaseAndInStepTime) {
  auto a = synthetic(small(1.0), "_a");
  auto b = synthetic(small(1.1), "_b");
  auto r = compare_runs(a, b);
  const auto* experts = row(r.by_phase, "moe_experts_fwd");
  ASSERT_NE(experts, nullptr);
  EXPECT_NEAR(*experts->median_error_pct, 10.0, 1e-6);
  EXPECT_NEAR(*experts->p95_error_pct, 10.0, 1e-6);
  EXPECT_NEAR(experts->b.median_us / experts->a.median_us, 1.1, 1e-9);
  EXPECT_EQ(experts->a.count, 4U * 3U * 2U * 2U);  // ranks x steps x layers x micro-batches
  // Step time: everything scales but the fixed host gaps between layers, so a little under 10%.
  EXPECT_GT(*r.step_time_error_pct, 9.0);
  EXPECT_LE(*r.step_time_error_pct, 10.0 + 1e-9);
  ASSERT_TRUE(r.walls_a && r.walls_b);
  EXPECT_NEAR(r.walls_b->compute_us / r.walls_a->compute_us, 1.1, 1e-6);
  // Per layer and per micro-batch tables exist where both sides have them.
  EXPECT_EQ(r.by_phase_layer.size(), 10U * 2U);       // 10 per-layer phases x 2 layers
  EXPECT_EQ(r.by_phase_microbatch.size(), 10U * 2U);  // 10 per-layer phases x 2 micro-batches
  for (const auto& row : r.by_phase_layer) {
    ASSERT_TRUE(row.layer.has_value());
    if (row.wall == profiler::Wall::compute) {
      EXPECT_NEAR(*row.median_error_pct, 10.0, 1e-6) << row.phase;
    }
  }
}

TEST(Compare, FailAboveChecksStepTimeMajorPhasesAndPeakMemory) {
  auto a = synthetic(small(1.0), "_a");
  auto b = synthetic(small(1.1), "_b");
  CompareOptions o;
  o.fail_above_pct = 5.0;
  auto r = compare_runs(a, b, o);
  EXPECT_TRUE(r.failed());
  ASSERT_FALSE(r.checks.empty());
  EXPECT_EQ(r.checks.front().what, "step time (median)");
  EXPECT_TRUE(r.checks.front().failed);
  bool has_phase = false;
  bool has_memory = false;
  for (const auto& c : r.checks) {
    has_phase |= c.what.rfind("phase ", 0) == 0;
    has_memory |= c.what == "peak memory";
  }
  EXPECT_TRUE(has_phase);
  EXPECT_TRUE(has_memory);
  o.fail_above_pct = 10.5;
  EXPECT_FALSE(compare_runs(a, b, o).failed());
  o.fail_above_pct.reset();
  EXPECT_FALSE(compare_runs(a, b, o).failed());  // no threshold, no verdict
  auto text = format_compare_text(compare_runs(a, b, CompareOptions{5.0, 0.05}));
  EXPECT_NE(text.find("--fail-above 5.0%: FAIL: step time (median) +"), std::string::npos) << text;
}

TEST(Compare, RecordsOnOneSideOnlyAreListedByKey) {
  auto a = synthetic(small(1.0, 4), "_a");
  auto b = synthetic(small(1.0, 3), "_b");
  auto r = compare_runs(a, b);
  const auto per_step = static_cast<std::size_t>(4 * synthetic_records_per_rank_step(small()));
  EXPECT_EQ(r.only_in_a.size(), per_step);  // step 3 of every rank
  EXPECT_TRUE(r.only_in_b.empty());
  for (const auto& k : r.only_in_a) EXPECT_EQ(k.step, 3);
  EXPECT_EQ(r.matched_steps, (std::vector<int>{0, 1, 2}));
  auto j = compare_json(r);
  EXPECT_EQ(j["only_in_a"].size(), per_step);
  EXPECT_EQ(j["only_in_a"][0]["step"], 3);
  auto text = format_compare_text(r, 3);
  EXPECT_NE(text.find("only in A: " + std::to_string(per_step) + " record(s) (first 3; all in --json)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("  step 3 rank 0 "), std::string::npos) << text;
}

TEST(Compare, DuplicateKeyIsAnErrorNamingRunAndKey) {
  auto a = synthetic(small(), "_a");
  auto b = a;
  b.phases.push_back(b.phases.front());
  try {
    compare_runs(a, b);
    FAIL() << "no error";
  } catch (const InputError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("duplicate record key (step 0 rank 0 data_h2d)"), std::string::npos) << m;
  }
}

TEST(Compare, RunsWithoutACommonRecordAreNotComparable) {
  auto a = synthetic(small(), "_a");
  auto b = a;
  for (auto& p : b.phases) p.step += 100;
  EXPECT_THROW(compare_runs(a, b), InputError);
}

TEST(Compare, JsonHoldsEveryRowErrorsAndVerdict) {
  auto a = synthetic(small(1.0), "_a");
  auto b = synthetic(small(1.2), "_b");
  CompareOptions o;
  o.fail_above_pct = 50;
  auto j = compare_json(compare_runs(a, b, o));
  EXPECT_EQ(j["error_definition"], "100 * (B - A) / A");
  EXPECT_EQ(j["phases"].size(), 15U);
  EXPECT_EQ(j["phase_layers"].size(), 20U);
  EXPECT_NEAR(j["phases"][0]["median_error_pct"].get<double>(), 20.0, 1e-6);
  EXPECT_NEAR(j["phases"][0]["median_abs_error_pct"].get<double>(), 20.0, 1e-6);
  EXPECT_EQ(j["failed"], false);
  EXPECT_TRUE(j["walls_us"]["a"].contains("bubble"));
  EXPECT_EQ(j["peak_memory_bytes"]["a_kind"], "model");
}

TEST(Compare, ErrorIsUndefinedWhenTheReferenceIsZero) {
  EXPECT_FALSE(signed_error_pct(0.0, 1.0).has_value());
  EXPECT_DOUBLE_EQ(*signed_error_pct(2.0, 3.0), 50.0);
  EXPECT_DOUBLE_EQ(*signed_error_pct(2.0, 1.0), -50.0);
}

TEST(Compare, RunsOfDifferentScenariosGetAWarningBanner) {
  auto a = synthetic(small(), "_a");
  auto b = synthetic(small(), "_b");
  EXPECT_TRUE(compare_runs(a, b).different_scenarios.empty());
  EXPECT_EQ(format_compare_text(compare_runs(a, b), 5).find("WARNING"), std::string::npos);
  b.header.scenario.name = "another";
  b.header.scenario.hash = "00000000000000ff";
  const auto r = compare_runs(a, b);
  ASSERT_EQ(r.different_scenarios.size(), 2U);
  const std::string text = format_compare_text(r, 5);
  EXPECT_EQ(text.rfind("!!!!", 0), 0U) << text.substr(0, 300);
  EXPECT_NE(text.find("WARNING: A and B are NOT runs of the same scenario"), std::string::npos);
  EXPECT_NE(text.find("scenario names differ: A \"" + a.header.scenario.name + "\", B \"another\""), std::string::npos)
      << text.substr(0, 400);
  EXPECT_NE(text.find("B hash 00000000000000ff"), std::string::npos);
  EXPECT_EQ(compare_json(r)["different_scenarios"].size(), 2U);
}
