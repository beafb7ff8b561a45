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
  // Saved activations: the memory model's `activations` of the largest class on a simulated side.
  EXPECT_EQ(j["activation_memory_bytes"]["a_kind"], "model");
  EXPECT_DOUBLE_EQ(j["activation_memory_bytes"]["a"].get<double>(), 8.0 * (1ULL << 30));
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

TEST(Compare, ARunWithoutSummaryJsonIsNamedNotSilentlyNa) {
  auto a = synthetic(small(), "_a");
  auto b = synthetic(small(), "_b");
  ASSERT_TRUE(a.summary.has_value());
  EXPECT_TRUE(compare_runs(a, b).missing_summary.empty());
  b.summary.reset();  // summary.json deleted
  const auto r = compare_runs(a, b);
  ASSERT_EQ(r.missing_summary.size(), 1U);
  EXPECT_EQ(r.missing_summary[0].rfind("B (", 0), 0U) << r.missing_summary[0];
  EXPECT_NE(r.missing_summary[0].find("has no summary.json: its peak memory and saved activations are n/a"),
            std::string::npos)
      << r.missing_summary[0];
  EXPECT_NE(format_compare_text(r, 5).find("warning: B ("), std::string::npos);
  EXPECT_EQ(compare_json(r)["missing_summary"].size(), 1U);
}

namespace {

// One record of a hand-made run: `phase` on `rank`, micro-batch `mb` (kAbsent: none), [start, end) us.
void add(profiler::RunData& run, int rank, const std::string& phase, int mb, double start, double end) {
  profiler::PhaseRecord p;
  p.step = 0;
  p.rank = rank;
  p.phase = run.names.phases.intern(phase);
  p.stream = run.names.streams.intern("compute");
  p.microbatch = mb;
  p.start_us = start;
  p.dur_us = end - start;
  run.phases.push_back(p);
}

profiler::RunData megatron_timers(const std::vector<std::pair<std::string, double>>& timers, double step_us) {
  profiler::RunData t;
  t.header.scenario.name = "timers";
  t.header.world_size = 2;
  t.run_json = Json{{"settings", {{"import", {{"format", "megatron-log"}}}}}};
  t.steps.push_back({0, 0, 0.0, step_us});
  for (const auto& [name, us] : timers) add(t, 0, name, profiler::kAbsent, 0.0, us);
  return t;
}

}  // namespace

TEST(Compare, MegatronTimersAreComparedWithTheRecordsRolledUpIntoThem) {
  profiler::RunData sim;
  sim.header.scenario.name = "timers";
  sim.header.world_size = 2;
  sim.steps = {{0, 0, 0.0, 100.0}, {0, 1, 0.0, 120.0}};
  // Rank 0: two micro-batches, a pipeline send between forward and backward (not forward-compute).
  add(sim, 0, "host_to_device", 0, 0, 2);
  add(sim, 0, "attn_qkv_fwd", 0, 2, 10);
  add(sim, 0, "pp_fwd_send", 0, 10, 30);
  add(sim, 0, "attn_qkv_fwd", 1, 30, 35);
  add(sim, 0, "attn_qkv_dgrad", 0, 40, 50);
  add(sim, 0, "attn_qkv_wgrad", 1, 50, 52);
  add(sim, 0, "dp_grad_reduce_scatter", profiler::kAbsent, 55, 70);
  add(sim, 0, "optimizer_step", profiler::kAbsent, 70, 80);
  add(sim, 0, "dp_param_allgather", profiler::kAbsent, 80, 95);
  add(sim, 0, "training_metrics_read", profiler::kAbsent, 95, 100);
  // Rank 1: a longer forward; each timer is the largest over the ranks.
  add(sim, 1, "attn_qkv_fwd", 0, 0, 40);
  auto timers = megatron_timers({{"forward-backward", 80.0},
                                 {"forward-compute", 40.0},
                                 {"backward-compute", 10.0},
                                 {"all-grads-sync", 15.0},
                                 {"optimizer", 20.0},
                                 {"batch-generator", 1.0}},
                                120.0);
  auto r = compare_runs(timers, sim);
  EXPECT_TRUE(r.timer_view);
  EXPECT_FALSE(r.walls_a || r.walls_b);
  auto b_of = [&](const std::string& n) {
    const auto* x = row(r.by_phase, n);
    return x == nullptr ? -1.0 : x->b.median_us;
  };
  EXPECT_DOUBLE_EQ(b_of("forward-backward"), 70.0);  // 0 .. 70 on rank 0 (optimizer and metrics left out)
  EXPECT_DOUBLE_EQ(b_of("forward-compute"), 40.0);   // rank 1's 40 over rank 0's (0..10) + (30..35)
  EXPECT_DOUBLE_EQ(b_of("backward-compute"), 12.0);  // (40..50) + (50..52)
  EXPECT_DOUBLE_EQ(b_of("all-grads-sync"), 15.0);
  EXPECT_DOUBLE_EQ(b_of("optimizer"), 25.0);  // optimizer_step and the parameter all-gather
  EXPECT_EQ(r.matched, 5U);
  ASSERT_EQ(r.only_in_a.size(), 1U);
  EXPECT_EQ(r.only_in_a[0].phase, "batch-generator");
  ASSERT_EQ(r.only_in_b.size(), 1U);
  EXPECT_EQ(r.only_in_b[0].phase, "params-all-gather");
  EXPECT_DOUBLE_EQ(r.step_time_b.median, 120.0);  // the slowest rank's step
  EXPECT_NEAR(*r.step_time_error_pct, 0.0, 1e-9);
  EXPECT_TRUE(compare_json(r)["megatron_timers"].get<bool>());
  EXPECT_NE(format_compare_text(r).find("Megatron-LM timers"), std::string::npos);
  // Without a run of timers on either side, records are compared as records.
  EXPECT_FALSE(compare_runs(sim, sim).timer_view);
}
