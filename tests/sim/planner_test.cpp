// The what-if planner (sim/planner.hpp, docs/planner.md): search grammar and its errors, pruning by
// the scenario rules and by memory, the estimator against the analytic simulator, bounded streaming
// outputs, shards that merge into the unsharded plan, and the CLI (ready scenario files that pass
// `threewalls validate`, exit codes).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include "../support/models.hpp"
#include "../support/shell.hpp"
#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/calibration/resolve.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/sim/planner.hpp"
#include "threewalls/sim/simgrid_network.hpp"
#include "threewalls/sim/simulator.hpp"

namespace threewalls::sim {
namespace {

namespace fs = std::filesystem;

fs::path example(const std::string& name) {
  return fs::path(THREEWALLS_SOURCE_DIR) / "scenarios" / "examples" / (name + ".toml");
}

struct H100 {
  calibration::Profile profile;
  calibration::CostModel model;
  CostModelCoster coster;
  H100()
      : profile(calibration::Profile::load(calibration::resolve_profile("auto", "h100", {}).path)),
        model(profile),
        coster(model) {}
};

const H100& h100() {
  static const H100 p;
  return p;
}

// Mixtral-8x7B on 64 GPUs, a small search around the example's layout.
PlanOptions mixtral_options(const scenarios::Scenario& s, const std::string& spec) {
  PlanOptions o;
  o.gpus = 64;
  o.search = parse_search(spec, default_search(s, 64));
  o.top_k = 4;
  o.losers_per_reason = 2;
  return o;
}

const char* kSmall = "tp=1,2;pp=1,2,4;vpp=1,2;ep=4,8;mbs=1,2;recompute=none,selective";

TEST(PlanSearch, ParsesListsAndRanges) {
  const auto s = scenarios::load_scenario(example("mixtral_8x7b_64gpu"));
  const SearchSpace sp = parse_search("tp=1..8; pp=1..3; recompute=none,full; cuda_graphs=none,attn+moe_router",
                                      default_search(s, 64));
  EXPECT_EQ(sp.tp, (std::vector<int>{1, 2, 4, 8}));  // a..b of a layout size: powers of two
  EXPECT_EQ(sp.pp, (std::vector<int>{1, 2, 3}));     // pp: every integer
  ASSERT_EQ(sp.recompute.size(), 2U);
  EXPECT_EQ(sp.cuda_graphs, (std::vector<std::string>{"none", "attn+moe_router"}));
  // The canonical spec reads back into the same space.
  EXPECT_EQ(parse_search(sp.spec(), SearchSpace{}).spec(), sp.spec());
  EXPECT_EQ(sp.size(), parse_search(sp.spec(), SearchSpace{}).size());
}

TEST(PlanSearch, UnknownKeyNamesTheNearestAndTheKeys) {
  const auto s = scenarios::load_scenario(example("mixtral_8x7b_64gpu"));
  try {
    (void)parse_search("tpp=1,2", default_search(s, 64));
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unknown key 'tpp'"), std::string::npos) << m;
    EXPECT_NE(m.find("did you mean 'tp'"), std::string::npos) << m;
    EXPECT_NE(m.find("keys: tp, cp, ep, etp, mbs"), std::string::npos) << m;
  }
}

TEST(PlanSearch, DefaultsKeepTheScenariosDispatcherAndPrecision) {
  auto s = scenarios::load_scenario(example("mixtral_8x7b_64gpu"));
  EXPECT_EQ(default_search(s, 64).precision, std::vector<scenarios::Precision>{s.exec().precision});
  s.train->exec.precision = scenarios::Precision::fp8;  // an FP8 recipe is planned in FP8 unless asked
  EXPECT_EQ(default_search(s, 64).precision, std::vector<scenarios::Precision>{scenarios::Precision::fp8});
  EXPECT_EQ(default_search(s, 64).dispatcher, std::vector<scenarios::Dispatcher>{s.exec().token_dispatcher});
}

TEST(PlanSearch, BadValuesListTheAllowedOnes) {
  const auto s = scenarios::load_scenario(example("mixtral_8x7b_64gpu"));
  const auto d = default_search(s, 64);
  auto message = [&](const std::string& spec) {
    try {
      (void)parse_search(spec, d);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("dispatcher=deepep").find("alltoall, allgather, flex"), std::string::npos);
  EXPECT_NE(message("recompute=some").find("none, selective, full"), std::string::npos);
  EXPECT_NE(message("precision=fp4").find("bf16, fp8"), std::string::npos);
  EXPECT_NE(message("cuda_graphs=atn").find("did you mean 'attn'"), std::string::npos);
  EXPECT_NE(message("tp=0").find("not a positive integer"), std::string::npos);
  EXPECT_NE(message("pp=8..2").find("empty"), std::string::npos);
  EXPECT_NE(message("tp=1;tp=2").find("given twice"), std::string::npos);
}

TEST(PlanEstimator, LayoutRulesPruneWithTheRuleId) {
  const auto loaded = scenarios::load_scenario_file(example("mixtral_8x7b_64gpu"));
  PlanEstimator est(loaded, h100().coster, 64);
  Candidate c;
  c.tp = 1;
  c.pp = 1;
  c.dp = 64;
  c.ep = 16;  // Mixtral has 8 experts
  c.edp = 4;
  const PlanRow r = est.evaluate(c);
  EXPECT_EQ(r.outcome, Outcome::rule);
  EXPECT_NE(r.rule.find("ep-experts"), std::string::npos) << r.rule;
  c.ep = 8;
  c.edp = 8;
  c.pp = 2;
  c.vpp = 4;
  c.dp = 32;
  c.edp = 4;
  c.mbs = 1;
  // 256 / (1 x 32) = 8 micro-batches: a multiple of pp, so the interleaved schedule is allowed.
  EXPECT_EQ(est.evaluate(c).outcome, Outcome::estimated);
}

// The planner prunes a layout exactly when `threewalls sim` refuses it: a scenario's own explicit
// split with empty stages (more virtual stages than layers) is kept and estimated, as sim runs it;
// the same pipeline without an explicit split is pruned by the loader's rule pp-layers.
TEST(PlanEstimator, ExplicitEmptyStagesAreKeptAsSimKeepsThem) {
  const auto loaded = scenarios::load_scenario_text(R"(schema_version = 1
[model]
num_layers = 2
hidden_size = 512
num_attention_heads = 8
ffn_hidden_size = 2048
vocab_size = 32000
[parallel]
pp = 4
layers_per_stage = [0, 1, 1, 0]
[train]
micro_batch_size = 1
global_batch_size = 8
seq_length = 1024
[cluster]
gpu = "h100"
gpus_per_node = 4
nodes = 1
)",
                                                    "empty_stages.toml");
  PlanEstimator est(loaded, h100().coster, 4);
  Candidate c;
  c.pp = 4;
  const PlanRow r = est.evaluate(c);
  EXPECT_EQ(r.outcome, Outcome::estimated) << r.rule;
  scenarios::Scenario s = est.scenario_of(c);
  EXPECT_EQ(s.parallel.layers_per_stage, (std::vector<int>{0, 1, 1, 0}));
  s.run.profiler.enabled = false;
  SimOptions opt;
  opt.fidelity = Fidelity::analytic;
  opt.steps = 1;
  const SimResult sim = simulate(s, h100().coster, ProfileInfoForHeader{"test", "", "h100", "test", ""}, opt);
  EXPECT_GT(sim.summary.steps.back().step_time_us, 0.0);
  // Another pipeline (vpp 2: 8 virtual stages) has no split of the scenario's: the rule prunes it.
  c.vpp = 2;
  const PlanRow pruned = est.evaluate(c);
  EXPECT_EQ(pruned.outcome, Outcome::rule);
  EXPECT_EQ(pruned.rule, "pp-layers");
}

TEST(PlanEstimator, MemoryPrunesBeforeTiming) {
  const auto loaded = scenarios::load_scenario_file(example("deepseek_v3_1024gpu"));
  PlanEstimator est(loaded, h100().coster, 1024);
  Candidate c;  // DeepSeek-V3 without pipeline, EP 8: every GPU holds 32 experts x 58 layers
  c.tp = 8;
  c.pp = 1;
  c.dp = 128;
  c.ep = 8;
  c.edp = 128;
  const PlanRow r = est.evaluate(c);
  EXPECT_EQ(r.outcome, Outcome::oom);
  EXPECT_GT(r.peak_bytes, r.capacity_bytes);
  EXPECT_EQ(est.reduced_simulations(), 0U);  // no step time for a layout that does not fit
}

// The NCCL communicators and peers of a candidate's stages come from a communication graph shared
// by every candidate with the same communication key (which groups have more than one rank,
// pipeline depth 1, 2 or more, interleaving, options): every stage's buffers equal those counted on
// the candidate's own graph (an estimator that has seen only that candidate).
TEST(PlanEstimator, SharedCommunicationGraphsGiveEachCandidatesOwnMemory) {
  const auto loaded = scenarios::load_scenario_file(example("mixtral_8x7b_64gpu"));
  ASSERT_TRUE(h100().coster.nccl_memory().has_value());  // else the memory model counts no communicators
  const SearchSpace sp =
      parse_search("tp=1,2,8;cp=1,2;pp=1..4;vpp=1,2;ep=1,2,8;etp=1,2;mbs=1;recompute=full;dispatcher=alltoall,flex",
                   default_search(loaded.scenario, 64));
  // In both orders, so that each key's graph comes once from a shallower and once from a deeper pipeline.
  PlanEstimator forward(loaded, h100().coster, 64);
  PlanEstimator backward(loaded, h100().coster, 64);
  const std::uint64_t n = sp.size();
  std::vector<std::optional<scenarios::Scenario>> scenarios(n);
  std::vector<MemoryReport> mem_forward(n), mem_backward(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    const Candidate c = candidate_at(sp, 64, i);
    if (c.dp == 0 || c.edp == 0) continue;
    try {
      scenarios[i] = forward.scenario_of(c);
    } catch (const scenarios::ScenarioError&) {
      continue;  // pruned by a layout rule
    }
    mem_forward[i] = forward.memory(*scenarios[i], c);
  }
  for (std::uint64_t i = n; i-- > 0;) {
    if (scenarios[i]) mem_backward[i] = backward.memory(*scenarios[i], candidate_at(sp, 64, i));
  }
  int compared = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    if (!scenarios[i]) continue;
    const Candidate c = candidate_at(sp, 64, i);
    PlanEstimator own_estimator(loaded, h100().coster, 64);
    const MemoryReport own = own_estimator.memory(*scenarios[i], c);
    ASSERT_EQ(mem_forward[i].classes.size(), own.classes.size());
    for (std::size_t k = 0; k < own.classes.size(); ++k) {
      EXPECT_EQ(mem_forward[i].classes[k].breakdown.buffers.value, own.classes[k].breakdown.buffers.value)
          << c.layout() << " class " << k;
      EXPECT_EQ(mem_backward[i].classes[k].breakdown.buffers.value, own.classes[k].breakdown.buffers.value)
          << c.layout() << " class " << k;
    }
    ++compared;
  }
  EXPECT_GE(compared, 40);
}

// The closed form against the analytic simulator on the example's own layout.
// The estimate of the one candidate `search` gives on `gpus` GPUs, and the analytic simulation of
// the candidate's scenario.
struct EstimateAndSimulation {
  PlanRow row;
  SimResult sim;
};
EstimateAndSimulation estimate_and_simulate(const scenarios::LoadedScenario& loaded, int gpus,
                                            const std::string& search) {
  PlanEstimator est(loaded, h100().coster, gpus);
  const SearchSpace sp = parse_search(search, default_search(loaded.scenario, gpus));
  EXPECT_EQ(sp.size(), 1U);
  const Candidate c = candidate_at(sp, gpus, 0);
  EstimateAndSimulation out{est.evaluate(c), {}};
  EXPECT_EQ(out.row.outcome, Outcome::estimated);
  scenarios::Scenario s = est.scenario_of(c);
  s.run.profiler.enabled = false;
  SimOptions opt;
  opt.fidelity = Fidelity::analytic;
  opt.steps = 1;
  out.sim = simulate(s, h100().coster, ProfileInfoForHeader{"test", "", "h100", "test", ""}, opt);
  return out;
}

TEST(PlanEstimator, AgreesWithTheAnalyticSimulatorOnMixtral) {
  const auto loaded = scenarios::load_scenario_file(example("mixtral_8x7b_64gpu"));
  const auto [r, sim] = estimate_and_simulate(loaded, 64, "tp=1;pp=4;vpp=1;ep=8;mbs=1;recompute=selective");
  ASSERT_EQ(r.outcome, Outcome::estimated);
  const double simulated = sim.summary.steps.back().step_time_us;
  // A profile that models NCCL residency slows kernels beside the posted pipeline receives; the
  // reduced runs charge them too (docs/planner.md).
  EXPECT_NEAR(r.step_time_us / simulated, 1.0, 0.02) << r.step_time_us << " vs " << simulated;
  double peak = 0.0;
  for (const auto& cm : sim.memory.classes) peak = std::max(peak, cm.peak().value);
  // The same memory model, on a skeleton graph with the NCCL communicators and peers of the
  // candidate's own ops and, per stage, the ops of the candidate's reduced scenario that set its
  // runners' memory (streams, handles, operand buffers: sim::runner_ops): 0.4% under on this layout
  // (docs/planner.md).
  EXPECT_LE(r.peak_bytes, peak);
  EXPECT_NEAR(r.peak_bytes / peak, 1.0, 0.01);
  const auto& w = r.walls;
  EXPECT_NEAR(w.compute_us + w.exposed_comm_us + w.bubble_us + w.host_us, r.step_time_us, 1e-6 * r.step_time_us);
}

TEST(PlanEstimator, ChargesTheExpertParallelOverlapAsTheSimulatorDoes) {
  // An MoE model whose EP group spans two nodes on an interleaved pipeline, with and without the
  // combined 1F1B schedule (overlap_moe_expert_parallel_comm): the estimate follows the analytic
  // simulator in both, so the overlap's saving is charged, not just the communication it overlaps.
  auto text = [](bool overlap) {
    return R"(schema_version = 1
name = "plan_ep_overlap"
[model]
)" + test::olmoe_model_keys(8) +
           R"([parallel]
pp = 2
vpp = 2
ep = 4
[train]
micro_batch_size = 1
global_batch_size = 32
seq_length = 4096
overlap_moe_expert_parallel_comm = )" +
           (overlap ? "true" : "false") + R"(
[cluster]
gpu = "h100"
gpus_per_node = 2
nodes = 4
[run]
steps = 1
)";
  };
  auto step_times = [&](bool overlap) {
    const auto loaded = scenarios::load_scenario_text(text(overlap), "plan_ep_overlap.toml");
    const auto [r, sim] = estimate_and_simulate(loaded, 8, "tp=1;pp=2;vpp=2;ep=4;mbs=1;recompute=none");
    return std::make_pair(r.step_time_us, sim.summary.steps.back().step_time_us);
  };
  const auto [est_plain, sim_plain] = step_times(false);
  const auto [est_overlap, sim_overlap] = step_times(true);
  ASSERT_LT(sim_overlap, 0.95 * sim_plain);  // the case has communication to hide
  EXPECT_NEAR(est_plain / sim_plain, 1.0, 0.05) << est_plain << " vs " << sim_plain;
  EXPECT_NEAR(est_overlap / sim_overlap, 1.0, 0.05) << est_overlap << " vs " << sim_overlap;
  // The saving itself, estimated against simulated, within a third.
  EXPECT_NEAR((est_plain - est_overlap) / (sim_plain - sim_overlap), 1.0, 0.33);
}

TEST(PlanSweep, KeepsBoundedTopAndLosersAndCountsEveryCandidate) {
  const auto loaded = scenarios::load_scenario_file(example("mixtral_8x7b_64gpu"));
  const PlanOptions o = mixtral_options(loaded.scenario, kSmall);
  const PlanResult r = run_plan(loaded, h100().coster, o);
  const auto& c = r.counters;
  EXPECT_EQ(c.enumerated, o.search.size());
  std::uint64_t rules = 0;
  for (const auto& [k, v] : c.rule) rules += v;
  EXPECT_EQ(rules + c.oom + c.estimated, c.enumerated);
  ASSERT_EQ(r.top.size(), 4U);
  for (std::size_t i = 1; i < r.top.size(); ++i) EXPECT_LE(r.top[i - 1].step_time_us, r.top[i].step_time_us);
  EXPECT_EQ(r.top.front().why, "best");
  for (std::size_t i = 1; i < r.top.size(); ++i) EXPECT_NE(r.top[i].why.find("% step:"), std::string::npos);
  EXPECT_LE(r.losers.size(), 2U * 5U);  // 2 per reason, 5 reasons at most
  // The reduced simulations are shared by candidates that differ only in pp and vpp.
  EXPECT_LT(c.reduced_simulations, c.estimated);
}

TEST(PlanSweep, ShardsMergeIntoTheUnshardedPlan) {
  const auto loaded = scenarios::load_scenario_file(example("mixtral_8x7b_64gpu"));
  PlanOptions o = mixtral_options(loaded.scenario, kSmall);
  const PlanResult whole = run_plan(loaded, h100().coster, o);
  std::vector<PlanResult> shards;
  for (int i = 0; i < 3; ++i) {
    o.shard_index = i;
    o.shard_count = 3;
    // Through JSON, as plan-merge reads them.
    shards.push_back(plan_from_json(Json::parse(plan_to_json(run_plan(loaded, h100().coster, o)).dump()), "shard"));
  }
  const PlanResult merged = merge_plans(shards);
  EXPECT_EQ(merged.counters.enumerated, whole.counters.enumerated);
  EXPECT_EQ(merged.counters.estimated, whole.counters.estimated);
  EXPECT_EQ(merged.counters.oom, whole.counters.oom);
  EXPECT_EQ(merged.counters.rule, whole.counters.rule);
  EXPECT_EQ(merged.counters.dominant, whole.counters.dominant);
  ASSERT_EQ(merged.top.size(), whole.top.size());
  for (std::size_t i = 0; i < whole.top.size(); ++i) {
    EXPECT_EQ(merged.top[i].cand.index, whole.top[i].cand.index);
    EXPECT_DOUBLE_EQ(merged.top[i].step_time_us, whole.top[i].step_time_us);
  }
  ASSERT_EQ(merged.losers.size(), whole.losers.size());
  for (std::size_t i = 0; i < whole.losers.size(); ++i) EXPECT_EQ(merged.losers[i].cand.index, whole.losers[i].cand.index);
  // A missing shard or a shard given twice is an error.
  EXPECT_THROW(merge_plans({shards[0], shards[1]}), InputError);
  EXPECT_THROW(merge_plans({shards[0], shards[1], shards[1]}), InputError);
  // A shard count of 2^31 - 1 (a mutated file, campaign F7: 8 GB and 44 s before the error) costs
  // what the files given cost: the error names the first missing shards and how many are missing.
  std::vector<PlanResult> huge{shards[0], shards[1]};
  for (auto& s : huge) s.shard_count = 2147483647;
  try {
    (void)merge_plans(huge);
    ADD_FAILURE() << "merged 2 of 2147483647 shards";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("missing shard(s) 2/2147483647, 3/2147483647"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(2147483645 in all)"), std::string::npos) << e.what();
  }
}

TEST(PlanSweep, ACorruptShardIsRefusedNeverRanked) {
  const auto loaded = scenarios::load_scenario_file(example("mixtral_8x7b_64gpu"));
  PlanOptions o = mixtral_options(loaded.scenario, kSmall);
  o.shard_index = 0;
  o.shard_count = 3;
  const Json good = Json::parse(plan_to_json(run_plan(loaded, h100().coster, o)).dump());
  ASSERT_FALSE(good.at("top").empty());
  auto error = [](const Json& j) {
    try {
      (void)plan_from_json(j, "shard.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Json j = good;
  j["top"][0]["step_time_us"] = -5.0;  // would rank first
  EXPECT_NE(error(j).find("shard.json: row "), std::string::npos) << error(j);
  EXPECT_NE(error(j).find("'step_time_us' is -5.0; allowed: a finite number > 0"), std::string::npos) << error(j);
  j = good;
  j["top"][0]["mfu"] = -0.5;
  EXPECT_NE(error(j).find("'mfu' is -0.5; allowed: a finite number >= 0"), std::string::npos) << error(j);
  j = good;
  j["top"][0]["flow"] = {{"step_time_us", 1.0}, {"microbatches_simulated", Json::array({3, 4})}};  // an older plan
  EXPECT_NE(error(j).find("'flow.microbatches_simulated' is [3,4]; allowed: an integer from 0 to 1000000000"),
            std::string::npos)
      << error(j);
  j = good;
  j["format"] = nullptr;  // once a raw JSON type error
  EXPECT_NE(error(j).find("shard.json: not a threewalls plan"), std::string::npos) << error(j);
  j = good;
  j["format_version"] = 7;
  EXPECT_NE(error(j).find("plan format_version 7 is not supported (this tool reads \"1.x\")"), std::string::npos)
      << error(j);
}
TEST(PlanSweep, ShardsInterleaveBlocksOfOneReducedKey) {
  // Each candidate in exactly one shard; a shard's candidates come in whole pp x vpp blocks (one
  // reduced-scenario key each), one per round of two blocks in snake order (shard 0 takes blocks 0,
  // 3, 4, 7, ...), so no shard gets only the costly (estimated) or only the cheap (pruned) part of the
  // enumeration.
  const auto loaded = scenarios::load_scenario_file(example("mixtral_8x7b_64gpu"));
  PlanOptions o = mixtral_options(loaded.scenario, kSmall);
  const std::uint64_t block = o.search.pp.size() * o.search.vpp.size();
  const PlanResult whole = run_plan(loaded, h100().coster, o);
  std::uint64_t total = 0, reduced = 0, estimated_min = ~0ULL, estimated_max = 0;
  for (int i = 0; i < 2; ++i) {
    o.shard_index = i;
    o.shard_count = 2;
    const PlanResult r = run_plan(loaded, h100().coster, o);
    EXPECT_EQ(r.counters.total % block, 0U);
    for (const auto& row : r.top) {
      const std::uint64_t b = row.cand.index / block;
      const std::uint64_t position = b / 2 % 2 == 0 ? b % 2 : 1 - b % 2;
      EXPECT_EQ(position, static_cast<std::uint64_t>(i)) << row.cand.index;
    }
    total += r.counters.total;
    reduced += r.counters.reduced_simulations;
    estimated_min = std::min(estimated_min, r.counters.estimated);
    estimated_max = std::max(estimated_max, r.counters.estimated);
  }
  EXPECT_EQ(total, o.search.size());
  EXPECT_EQ(reduced, whole.counters.reduced_simulations);  // no reduced simulation runs in two shards
  EXPECT_GT(estimated_min, 0U);
  EXPECT_LE(estimated_max, 2 * estimated_min);
}

// The scenarios of the top rows of `r`, a plan of `loaded` on `gpus` GPUs.
std::vector<scenarios::Scenario> top_scenarios(const scenarios::LoadedScenario& loaded, int gpus, const PlanResult& r) {
  PlanEstimator est(loaded, h100().coster, gpus);
  std::vector<scenarios::Scenario> out;
  for (const auto& row : r.top) out.push_back(est.scenario_of(row.cand));
  return out;
}

std::vector<PlanRow*> pointers(std::vector<PlanRow>& rows) {
  std::vector<PlanRow*> out;
  for (auto& row : rows) out.push_back(&row);
  return out;
}

TEST(PlanSweep, ParallelReSimulationsGiveTheSequentialRows) {
  const auto loaded = scenarios::load_scenario_file(example("mixtral_8x7b_64gpu"));
  PlanOptions o = mixtral_options(loaded.scenario, kSmall);
  o.top_k = 3;
  const PlanResult r = run_plan(loaded, h100().coster, o);
  ASSERT_EQ(r.top.size(), 3U);
  const std::vector<scenarios::Scenario> scenarios = top_scenarios(loaded, o.gpus, r);
  std::vector<PlanRow> one = r.top, three = r.top;
  const std::vector<PlanRow*> one_rows = pointers(one), three_rows = pointers(three);
  std::vector<std::size_t> started;
  resimulate_flow(scenarios, h100().coster, one_rows, 1, ResimMethod::steady_state,
                  [&](std::size_t i) { started.push_back(i); });
  resimulate_flow(scenarios, h100().coster, three_rows, 3);
  std::sort(started.begin(), started.end());
  EXPECT_EQ(started, (std::vector<std::size_t>{0, 1, 2}));  // once per row
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    EXPECT_EQ(one[i].flow_error, "");
    EXPECT_EQ(three[i].flow_error, "");
    ASSERT_TRUE(one[i].flow_step_time_us && three[i].flow_step_time_us) << i;
    EXPECT_EQ(*one[i].flow_step_time_us, *three[i].flow_step_time_us) << i;  // bit for bit
    EXPECT_EQ(*one[i].flow_peak_bytes, *three[i].flow_peak_bytes) << i;
    EXPECT_EQ(one[i].flow_walls->exposed_comm_us, three[i].flow_walls->exposed_comm_us) << i;
  }
  // Different layouts get different flow results: the rows are not mixed up between processes.
  EXPECT_NE(*three[0].flow_step_time_us, *three[1].flow_step_time_us);
}

TEST(PlanSweep, StepsStartedDuringTheSweepGiveTheSameRows) {
  const auto loaded = scenarios::load_scenario_file(example("mixtral_8x7b_64gpu"));
  PlanOptions o = mixtral_options(loaded.scenario, kSmall);
  o.top_k = 3;
  o.progress_every = 1;
  preload_simgrid_module();  // the children are forked during the sweep
  PlanEstimator ahead_est(loaded, h100().coster, o.gpus);
  ResimAhead ahead(ahead_est, h100().coster, 2, 1, ResimMethod::steady_state);
  int offers = 0;
  o.best_so_far = [&](const std::vector<PlanRow>& best) {
    ++offers;
    ahead.offer(best);
  };
  const PlanResult r = run_plan(loaded, h100().coster, o);
  ASSERT_EQ(r.top.size(), 3U);
  EXPECT_GT(offers, 1);
  ahead.offer(r.top);  // one step of the final top two at least is running or done
  const std::vector<scenarios::Scenario> scenarios = top_scenarios(loaded, o.gpus, r);
  std::vector<PlanRow> plain = r.top, early = r.top;
  const std::vector<PlanRow*> plain_rows = pointers(plain), early_rows = pointers(early);
  resimulate_flow(scenarios, h100().coster, plain_rows, 2);
  std::vector<std::size_t> started;
  resimulate_flow(
      scenarios, h100().coster, early_rows, 2, ResimMethod::steady_state, [&](std::size_t i) { started.push_back(i); },
      &ahead);
  std::sort(started.begin(), started.end());
  EXPECT_EQ(started, (std::vector<std::size_t>{0, 1, 2}));                           // once per row
  EXPECT_FALSE(ahead.take(r.top[0].cand.index, plain[0].flow_microbatches));         // none left
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    EXPECT_EQ(early[i].flow_error, "") << i;
    ASSERT_TRUE(plain[i].flow_step_time_us && early[i].flow_step_time_us) << i;
    EXPECT_EQ(*plain[i].flow_step_time_us, *early[i].flow_step_time_us) << i;  // bit for bit
    EXPECT_EQ(*plain[i].flow_peak_bytes, *early[i].flow_peak_bytes) << i;
    EXPECT_EQ(plain[i].flow_walls->exposed_comm_us, early[i].flow_walls->exposed_comm_us) << i;
    EXPECT_EQ(plain[i].flow_microbatches, early[i].flow_microbatches) << i;
    EXPECT_EQ(plain[i].flow_round, early[i].flow_round) << i;
  }
}

TEST(PlanSweep, SteadyStateMicroBatchesFollowThePipeline) {
  const auto loaded = scenarios::load_scenario_file(example("deepseek_v3_1024gpu"));
  scenarios::Scenario s = loaded.scenario;  // tp2 pp8 vpp4
  auto with = [&](int pp, int vpp, int m) {
    s.parallel.pp = pp;
    s.parallel.vpp = vpp;
    s.train->set_microbatches(m, s.parallel.dp);
    return resim_step(s, ResimMethod::steady_state);
  };
  EXPECT_EQ(with(16, 1, 960), (ResimStep{21, 1, 3}));   // three rounds from micro-batch pp + 1
  EXPECT_EQ(with(16, 2, 240), (ResimStep{48, 16, 1}));  // one round of pp micro-batches
  EXPECT_EQ(with(5, 1, 40), (ResimStep{10, 1, 3}));
  EXPECT_EQ(with(1, 1, 8), (ResimStep{6, 1, 3}));
  EXPECT_EQ(with(16, 1, 22), (ResimStep{21, 1, 3}));
  EXPECT_EQ(with(16, 1, 21), (ResimStep{21, 0, 0}));  // not longer than the short step: whole
  EXPECT_EQ(with(16, 2, 48), (ResimStep{48, 0, 0}));
  s.train->set_microbatches(960, s.parallel.dp);
  EXPECT_EQ(resim_step(s, ResimMethod::full), (ResimStep{960, 0, 0}));
  EXPECT_EQ(s.train->global_batch_size, 960LL * s.train->micro_batch_size * s.parallel.dp);
  EXPECT_EQ(to_string(ResimMethod::steady_state), std::string("steady"));
  EXPECT_EQ(resim_method_from("full"), ResimMethod::full);
  EXPECT_EQ(resim_method_from("Steady"), std::nullopt);
}

TEST(PlanSweep, SteadyStateReSimulationGivesTheWholeStep) {
  // Mixtral on 64 GPUs, pp 2 and 4 with and without interleaving (8 to 32 micro-batches per rank):
  // each row simulated whole and from the steady period of a short step.
  const auto loaded = scenarios::load_scenario_file(example("mixtral_8x7b_64gpu"));
  PlanOptions o = mixtral_options(loaded.scenario, "tp=1,2;pp=2,4;vpp=1,2;ep=8;mbs=1;recompute=selective");
  o.top_k = 8;
  const PlanResult r = run_plan(loaded, h100().coster, o);
  ASSERT_EQ(r.top.size(), 8U);
  PlanEstimator est(loaded, h100().coster, o.gpus);
  std::vector<scenarios::Scenario> scenarios;
  std::vector<PlanRow> whole = r.top, steady = r.top;
  std::vector<PlanRow*> whole_rows, steady_rows;
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    scenarios.push_back(est.scenario_of(r.top[i].cand));
    whole_rows.push_back(&whole[i]);
    steady_rows.push_back(&steady[i]);
  }
  resimulate_flow(scenarios, h100().coster, whole_rows, 2, ResimMethod::full);
  resimulate_flow(scenarios, h100().coster, steady_rows, 2, ResimMethod::steady_state);
  int extrapolated = 0;  // bit 0: a row without interleaving, bit 1: one with
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    ASSERT_EQ(whole[i].flow_error, "") << i;
    ASSERT_EQ(steady[i].flow_error, "") << i;
    const int m = scenarios[i].train->num_microbatches;
    EXPECT_EQ(whole[i].flow_microbatches, m);
    EXPECT_EQ(whole[i].flow_round, 0);
    const ResimStep st = resim_step(scenarios[i], ResimMethod::steady_state);
    EXPECT_EQ(steady[i].flow_microbatches, st.microbatches);
    EXPECT_EQ(steady[i].flow_round, st.round);
    if (st.round > 0) extrapolated |= scenarios[i].parallel.vpp > 1 ? 2 : 1;
    const double w = *whole[i].flow_step_time_us;
    // The documented tolerance (docs/planner.md, "Flow re-simulation"): 0.1% of the step time, the
    // walls within 1% of it, the same peak.
    EXPECT_NEAR(*steady[i].flow_step_time_us / w, 1.0, 1e-3) << r.top[i].cand.layout() << " m " << m;
    EXPECT_EQ(*steady[i].flow_peak_bytes, *whole[i].flow_peak_bytes) << i;
    const PlanWalls &a = *steady[i].flow_walls, &b = *whole[i].flow_walls;
    EXPECT_NEAR(a.compute_us, b.compute_us, 0.01 * w) << i;
    EXPECT_NEAR(a.exposed_comm_us, b.exposed_comm_us, 0.01 * w) << i;
    EXPECT_NEAR(a.bubble_us, b.bubble_us, 0.01 * w) << i;
    EXPECT_NEAR(a.host_us, b.host_us, 0.01 * w) << i;
  }
  EXPECT_EQ(extrapolated, 3);  // with and without interleaving
  // The simulated micro-batches travel with the plan's JSON (plan-merge reads them back).
  PlanResult with = r;
  with.top = steady;
  const PlanResult back = plan_from_json(Json::parse(plan_to_json(with).dump()), "plan.json");
  EXPECT_EQ(back.top[0].flow_microbatches, steady[0].flow_microbatches);
  EXPECT_EQ(back.top[0].flow_round, steady[0].flow_round);
  EXPECT_NE(plan_to_text(with).find("flow_s extrapolated by the steady period"), std::string::npos);
}

// Where the flow re-simulations rank the top rows otherwise than their estimates, the text says
// which re-simulated row is fastest; not when the first is.
TEST(PlanOutput, NamesTheFastestRowByFlowWhenTheEstimateRanksItLower) {
  PlanResult r;
  r.top.resize(3);
  r.top[0].flow_step_time_us = 2.977e6;
  r.top[1].flow_step_time_us = 2.777e6;
  r.top[2].flow_step_time_us = 3.068e6;
  const std::string said = "by flow fidelity #2 is the fastest re-simulated row: 2.777 s against #1's 2.977 s (-6.7%)";
  EXPECT_NE(plan_to_text(r).find(said), std::string::npos) << plan_to_text(r);
  r.top[0].flow_step_time_us = 2.5e6;
  EXPECT_EQ(plan_to_text(r).find("by flow fidelity"), std::string::npos);
  r.top[0].flow_step_time_us.reset();  // the first row not re-simulated: nothing to compare with
  EXPECT_EQ(plan_to_text(r).find("by flow fidelity"), std::string::npos);
}

// ---- the CLI ----

const std::string kBinary = test::threewalls_binary();

int cli(const std::string& args, std::string& output) { return test::threewalls_cli(args, output); }

fs::path fresh(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("threewalls_plan_test_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  return d;
}

TEST(PlanCli, WritesRankedOutputsAndScenarioFilesThatValidate) {
  ASSERT_TRUE(fs::exists(kBinary)) << kBinary;
  const fs::path out = fresh("out");
  std::string text;
  ASSERT_EQ(cli("plan " + example("mixtral_8x7b_64gpu").string() + " --gpus 64 --search '" + kSmall +
                    "' --top 3 --resim 1 --quiet --out " + out.string(),
                text),
            0)
      << text;
  EXPECT_NE(text.find("configurations "), std::string::npos) << text;
  for (const char* f : {"plan.json", "plan.csv", "plan.txt", "top_1.toml", "top_2.toml", "top_3.toml"}) {
    EXPECT_TRUE(fs::exists(out / f)) << f;
  }
  const Json j = read_json_file(out / "plan.json");
  EXPECT_EQ(j.at("format"), "threewalls.plan");
  EXPECT_EQ(j.at("top").size(), 3U);
  ASSERT_TRUE(j.at("top")[0].contains("flow")) << j.at("top")[0].dump();  // re-simulated with flow fidelity
  const double analytic = j.at("top")[0].at("step_time_us").get<double>();
  const double flow = j.at("top")[0].at("flow").at("step_time_us").get<double>();
  EXPECT_NEAR(flow / analytic, 1.0, 0.1);
  for (int i = 1; i <= 3; ++i) {
    std::string v;
    EXPECT_EQ(cli("validate " + (out / ("top_" + std::to_string(i) + ".toml")).string(), v), 0) << v;
  }
  // An existing output directory is not replaced without --overwrite.
  EXPECT_EQ(cli("plan " + example("mixtral_8x7b_64gpu").string() + " --gpus 64 --search 'tp=1;pp=4;ep=8' --out " +
                    out.string(),
                text),
            2)
      << text;
  fs::remove_all(out);
}

TEST(PlanCli, ShardsAndPlanMergeGiveTheSameCsv) {
  const fs::path dir = fresh("shards");
  const std::string base = "plan " + example("mixtral_8x7b_64gpu").string() + " --gpus 64 --search '" + kSmall +
                           "' --top 3 --resim 0 --quiet --format csv";
  std::string whole, out;
  ASSERT_EQ(cli(base + " --out " + (dir / "whole").string(), whole), 0) << whole;
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(cli(base + " --shard " + std::to_string(i) + "/2 --out " + (dir / ("s" + std::to_string(i))).string(), out),
              0)
        << out;
  }
  std::string merged;
  ASSERT_EQ(cli("plan-merge " + (dir / "s0" / "plan.json").string() + " " + (dir / "s1" / "plan.json").string() +
                    " --format csv --out " + (dir / "merged").string(),
                merged),
            0)
      << merged;
  EXPECT_EQ(merged, whole);
  EXPECT_TRUE(fs::exists(dir / "merged" / "top_1.toml"));
  ASSERT_NE(cli("plan-merge " + (dir / "s0" / "plan.json").string(), out), 0);
  EXPECT_NE(out.find("missing shard(s) 1/2"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(PlanCli, InputErrorsExitTwo) {
  std::string out;
  EXPECT_EQ(cli("plan " + example("mixtral_8x7b_64gpu").string() + " --gpus 64 --search 'tpp=2'", out), 2) << out;
  EXPECT_NE(out.find("did you mean 'tp'"), std::string::npos) << out;
  EXPECT_EQ(cli("plan " + example("mixtral_8x7b_64gpu").string() + " --gpus 60", out), 2) << out;
  EXPECT_NE(out.find("gpus_per_node = 8"), std::string::npos) << out;
  EXPECT_EQ(cli("plan " + example("mixtral_8x7b_64gpu").string() + " --gpus 64 --shard 2/2", out), 2) << out;
  EXPECT_EQ(cli("plan " + example("deepseek_v2_lite_offload").string() + " --gpus 8", out), 2) << out;
  EXPECT_NE(out.find("training scenario"), std::string::npos) << out;
}

}  // namespace
}  // namespace threewalls::sim
