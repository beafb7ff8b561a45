// threewalls sim end to end: every example simulates and its run directory passes the reader; same
// inputs give byte-identical output; OOM and slowdowns show in the summary.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "../support/models.hpp"
#include "sim_test_support.hpp"
#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/sim/simulator.hpp"

namespace threewalls::sim {
namespace {

namespace fs = std::filesystem;
using testing::in_child;

fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("threewalls_sim_test_" + std::to_string(getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p.parent_path());
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Simulates in a child (flow fidelity needs its own process) and writes `dir`.
std::string simulate_to(const scenarios::Scenario& s, const fs::path& dir, int steps, Fidelity f = Fidelity::flow) {
  return in_child([&]() {
    SimOptions o;
    o.fidelity = f;
    o.steps = steps;
    o.out_dir = dir;
    o.argv = {"threewalls", "sim", s.source_path};
    const SimResult r = simulate(s, "", o);
    return std::string("ok ") + std::to_string(r.summary.step_time_us.median);
  });
}

class ExampleScenario : public ::testing::TestWithParam<std::string> {};

TEST_P(ExampleScenario, SimulatesAndItsRunDirectoryPassesTheReader) {
  const fs::path file = testing::source_dir() / "scenarios/examples" / (GetParam() + ".toml");
  const scenarios::Scenario s = scenarios::load_scenario(file);
  const fs::path dir = scratch(GetParam());
  const int steps = std::min(s.run.steps, 2);
  const std::string out = simulate_to(s, dir, steps);
  ASSERT_EQ(out.rfind("ok", 0), 0U) << out;
  const profiler::RunData run = profiler::RunDirReader::read(dir);
  EXPECT_EQ(run.header.source, "sim");
  EXPECT_EQ(run.header.world_size, s.world_size());
  ASSERT_TRUE(run.summary.has_value());
  const Json& sum = *run.summary;
  EXPECT_EQ(sum.at("steps").size(), static_cast<std::size_t>(steps));
  EXPECT_GT(sum.at("steps").at(0).at("step_time_us").get<double>(), 0.0);
  // One phase record per op of the rank's class, per recorded step and recording rank.
  const auto graph = scenarios::expand(s, 0);
  std::size_t expected = 0;
  for (int r : run.header.ranks) {
    expected += graph.class_of(r).ops.size() * static_cast<std::size_t>(steps);
  }
  if (!graph.varies_per_step) {
    EXPECT_EQ(run.phases.size(), expected);
  }
  EXPECT_EQ(sum.at("memory").at("classes").size(), graph.classes.size());
  // Collectives name their group instance: the lowest rank of the group, never above the rank.
  const auto pp = run.names.groups.find("pp");
  for (const auto& p : run.phases) {
    if (p.group == profiler::kNoName || (pp && p.group == *pp)) continue;
    ASSERT_GE(p.group_id, 0) << run.names.phases.name(p.phase);
    ASSERT_LE(p.group_id, p.rank) << run.names.phases.name(p.phase);
  }
  // The walls add up to the step time.
  const Json& st = sum.at("steps").at(0);
  double walls = 0.0;
  for (const auto& [k, v] : st.at("walls_us").items()) walls += v.get<double>();
  EXPECT_NEAR(walls, st.at("step_time_us").get<double>(), 1e-3 * st.at("step_time_us").get<double>());
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Examples, ExampleScenario,
                         ::testing::Values("small_moe_1gpu", "small_moe_ep2", "small_moe_ep4", "small_moe_tp2_ep2",
                                           "deepseek_v2_lite_offload", "mixtral_8x7b_64gpu", "qwen3_235b_256gpu",
                                           "deepseek_v3_1024gpu", "deepseek_v3_2048gpu"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(Simulator, SameInputsGiveByteIdenticalRunDirectories) {
  const scenarios::Scenario s = scenarios::load_scenario(testing::source_dir() / "scenarios/examples/small_moe_tp2_ep2.toml");
  const fs::path a = scratch("same_a");
  const fs::path b = scratch("same_b");
  ASSERT_EQ(simulate_to(s, a, 2).rfind("ok", 0), 0U);
  ASSERT_EQ(simulate_to(s, b, 2).rfind("ok", 0), 0U);
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(a)) {
    ++files;
    EXPECT_EQ(slurp(e.path()), slurp(b / e.path().filename())) << e.path().filename();
  }
  EXPECT_GE(files, 3U);
  fs::remove_all(a);
  fs::remove_all(b);
}

scenarios::Scenario from_text(const std::string& text) {
  return scenarios::load_scenario_text(text, (testing::source_dir() / "tests/sim/inline.toml").string()).scenario;
}

std::string small_moe(const std::string& extra_cluster, const std::string& extra = "") {
  return R"(schema_version = 1
name = "small_moe_test"
[model]
name = "small"
num_layers = 2
hidden_size = 2048
num_attention_heads = 16
kv_channels = 128
vocab_size = 50304
num_experts = 16
moe_ffn_hidden_size = 1024
moe_router_topk = 4
[parallel]
ep = 2
[train]
micro_batch_size = 1
global_batch_size = 4
seq_length = 2048
[cluster]
gpu = "h100"
gpus_per_node = 2
nodes = 1
)" + extra_cluster + R"(
[run]
steps = 3
warmup_steps = 0
[run.profiler]
record_every_n_steps = 1
)" + extra;
}

TEST(Simulator, OutOfMemoryIsReportedInTheSummaryWithItsBreakdown) {
  const scenarios::Scenario s = from_text(small_moe("gpu_memory = \"2GiB\""));
  const fs::path dir = scratch("oom");
  ASSERT_EQ(simulate_to(s, dir, 1, Fidelity::analytic).rfind("ok", 0), 0U);
  const Json sum = read_json_file(dir / "summary.json");
  const Json& mem = sum.at("memory");
  EXPECT_TRUE(mem.at("oom").get<bool>());
  // The memory model with the options the simulator gives it (the profile's nccl.memory included).
  SimOptions o;
  o.fidelity = Fidelity::analytic;
  o.steps = 1;
  const MemoryReport model = simulate(s, "auto", o).memory;
  ASSERT_EQ(mem.at("classes").size(), model.classes.size());
  const Json& c = mem.at("classes").at(0);
  const auto& b = model.classes[0].breakdown;
  EXPECT_NEAR(c.at("breakdown_bytes").at("weights").get<double>(), b.weights.value, 1.0);
  EXPECT_NEAR(c.at("breakdown_bytes").at("optimizer").get<double>(), b.optimizer.value, 1.0);
  EXPECT_NEAR(c.at("breakdown_bytes").at("activations").get<double>(), b.activations.value, 1.0);
  EXPECT_NEAR(c.at("peak_bytes").get<double>(), model.classes[0].peak().value, 1.0);
  EXPECT_GT(c.at("peak_bytes").get<double>(), mem.at("gpu_memory_bytes").get<double>());
  fs::remove_all(dir);
}

TEST(Simulator, ASummaryWithoutPhaseStatisticsHasTheSameStepsAndWalls) {
  // Without phase statistics (and a run directory) the simulator keeps only the records the summary
  // reads: every record of each step's critical rank, the communication and coarse-view records of the
  // others. Everything but the phase table stays the same, also when the critical rank changes from a
  // step to the next (a GPU slow in step 1 only).
  const fs::path examples = testing::source_dir() / "scenarios/examples";
  const std::vector<std::pair<std::string, scenarios::Scenario>> cases = {
      {"small_moe_tp2_ep2", scenarios::load_scenario(examples / "small_moe_tp2_ep2.toml")},
      {"mixtral_8x7b_64gpu", scenarios::load_scenario(examples / "mixtral_8x7b_64gpu.toml")},
      {"slow rank 1 in step 1", from_text(small_moe("", R"(
[[cluster.slowdown]]
rank = 1
factor = 3.0
from_step = 1
to_step = 1
)"))}};
  for (const auto& [name, s] : cases) {
    // The summary (flow fidelity: one SimGrid engine per process) without its phase table, and
    // whether that table was empty.
    auto summary = [&](bool phase_stats) {
      return in_child([&]() {
        SimOptions o;
        o.steps = 3;
        o.phase_stats = phase_stats;
        OrderedJson j = simulate(s, "auto", o).summary_json;
        const bool phases = !j.at("phases").empty();
        j.erase("phases");
        return std::string(phases ? "phases " : "none ") + j.dump();
      });
    };
    const std::string full = summary(true);
    const std::string lean = summary(false);
    ASSERT_EQ(full.rfind("phases ", 0), 0U) << name << ": " << full.substr(0, 200);
    ASSERT_EQ(lean.rfind("none ", 0), 0U) << name << ": " << lean.substr(0, 200);
    EXPECT_NE(full.find("\"walls_us\":{"), std::string::npos) << name;
    EXPECT_EQ(full.substr(7), lean.substr(5)) << name;
  }
}

TEST(Simulator, ASlowGpuStretchesOnlyTheStepsItIsSlowIn) {
  const scenarios::Scenario s = from_text(small_moe("", R"(
[[cluster.slowdown]]
rank = 1
factor = 3.0
from_step = 1
to_step = 1
)"));
  const fs::path dir = scratch("slow");
  ASSERT_EQ(simulate_to(s, dir, 3).rfind("ok", 0), 0U);
  const Json sum = read_json_file(dir / "summary.json");
  const auto& steps = sum.at("steps");
  ASSERT_EQ(steps.size(), 3U);
  const double t0 = steps.at(0).at("step_time_us").get<double>();
  const double t1 = steps.at(1).at("step_time_us").get<double>();
  const double t2 = steps.at(2).at("step_time_us").get<double>();
  EXPECT_NEAR(t0, t2, 1e-6 * t0);
  EXPECT_GT(t1, 1.5 * t0);
  // Rank 1's kernels take 3x as long in step 1 (and only there); rank 0's do not change.
  const profiler::RunData run = profiler::RunDirReader::read(dir);
  // The longest compute record (a record of an op launched onto an idle stream also holds the
  // launch after its start marker, docs/simulator.md "Host lane").
  std::map<std::pair<int, int>, double> gemm;  // (step, rank) -> longest compute op's duration
  for (const auto& p : run.phases) {
    if (p.wall != profiler::Wall::compute) continue;
    double& d = gemm[{p.step, p.rank}];
    d = std::max(d, p.dur_us);
  }
  // The record also holds the part of the launch after its start marker (a few us, not slowed).
  EXPECT_NEAR(gemm.at({1, 1}) / gemm.at({0, 1}), 3.0, 0.02);
  EXPECT_LT(gemm.at({1, 1}), 3.0 * gemm.at({0, 1}) + 1e-3);
  EXPECT_NEAR(gemm.at({2, 1}), gemm.at({0, 1}), 1e-3);
  EXPECT_NEAR(gemm.at({1, 0}), gemm.at({0, 0}), 1e-3);
  fs::remove_all(dir);
}

// A slow GPU in every layout kind: its class of its own used to leave the ranks of its groups matching
// collectives against different member classes than the slow rank (a deadlock in every layout with
// more than one group kind). Rank 5 of 8 is three times slower; every layout completes, its step is
// longer than without the slowdown, and rank 5's own compute is three times as long.
class SlowRankLayout : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

std::string eight_gpus(const std::string& parallel, const std::string& cluster_extra) {
  return R"(schema_version = 1
name = "slow_rank_layout"
[model]
)" + test::small_moe_model_keys() +
         "[parallel]\n" + parallel +
         R"(
[train]
micro_batch_size = 1
global_batch_size = 16
seq_length = 1024
)" + (parallel.find("ep = ") != std::string::npos ? "routing_imbalance = 1.5\n" : "") +
         R"(
[cluster]
gpu = "h100"
gpus_per_node = 8
nodes = 1
)" + cluster_extra +
         R"(
[run]
steps = 1
)";
}

TEST_P(SlowRankLayout, CompletesAndTheSlowRankStretchesTheStep) {
  const std::string parallel = GetParam().second;
  const scenarios::Scenario fast = from_text(eight_gpus(parallel, ""));
  const scenarios::Scenario slow = from_text(eight_gpus(parallel, "[[cluster.slowdown]]\nrank = 5\nfactor = 3.0\n"));
  SimOptions o;
  o.fidelity = Fidelity::analytic;
  const SimResult a = simulate(fast, "auto", o);
  const SimResult b = simulate(slow, "auto", o);
  const double t_fast = a.summary.step_time_us.median;
  const double t_slow = b.summary.step_time_us.median;
  ASSERT_TRUE(std::isfinite(t_slow));
  EXPECT_GT(t_slow, 1.3 * t_fast) << GetParam().first << ": " << t_fast << " us -> " << t_slow << " us";
  // The slow rank has a class of its own whose label names it.
  bool named = false;
  for (const auto& c : b.classes)
    named = named || (c.ranks == std::vector<int>{5} && c.label.find("slow rank 5") != std::string::npos);
  EXPECT_TRUE(named) << GetParam().first;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SlowRankLayout,
    ::testing::Values(
        std::pair<std::string, std::string>{"DP", ""},
        std::pair<std::string, std::string>{"TP", "tp = 2\nsequence_parallel = true"},
        std::pair<std::string, std::string>{"PP", "pp = 2"},
        std::pair<std::string, std::string>{"VPP", "pp = 2\nvpp = 2"},
        std::pair<std::string, std::string>{"CP", "cp = 2"}, std::pair<std::string, std::string>{"EP", "ep = 8"},
        std::pair<std::string, std::string>{"TP_EP", "tp = 2\nep = 2\nsequence_parallel = true"},
        std::pair<std::string, std::string>{"PP_EP", "pp = 2\nep = 2"},
        std::pair<std::string, std::string>{"TP_PP_EP", "tp = 2\npp = 2\nep = 2\nsequence_parallel = true"},
        std::pair<std::string, std::string>{"ETP_EP", "tp = 2\netp = 2\nep = 2\nsequence_parallel = true"},
        std::pair<std::string, std::string>{"CP_EP", "cp = 2\nep = 4"}),
    [](const auto& p) { return p.param.first; });

TEST(Simulator, AnExistingRunDirectoryIsNotOverwrittenUnlessAsked) {
  const scenarios::Scenario s = from_text(small_moe(""));
  const fs::path dir = scratch("exists");
  ASSERT_EQ(simulate_to(s, dir, 1, Fidelity::analytic).rfind("ok", 0), 0U);
  const std::string again = simulate_to(s, dir, 1, Fidelity::analytic);
  EXPECT_EQ(again.rfind("CHILD FAILED", 0), 0U) << again;
  fs::remove_all(dir);
}

// A dense model of 8 layers on 4 stages (`vpp` model chunks each) with a tiny vocabulary (balanced
// stages), `m` micro-batches of one sequence, one step on one H100 node.
scenarios::Scenario pure_pipeline(int vpp, int m) {
  return from_text(R"(schema_version = 1
name = "pure_pipeline"
[model]
num_layers = 8
hidden_size = 4096
num_attention_heads = 32
ffn_hidden_size = 16384
vocab_size = 1024
[parallel]
pp = 4
vpp = )" + std::to_string(vpp) +
                   R"(
[train]
micro_batch_size = 1
global_batch_size = )" +
                   std::to_string(m) + R"(
seq_length = 4096
[cluster]
gpu = "h100"
gpus_per_node = 4
nodes = 1
[run]
steps = 1
)");
}

TEST(Simulator, APurePipelinesBubbleIsNearTheOneFOneBIdealOnceCollectiveWaitsCount) {
  // A dense model on 4 stages with 8 micro-batches and a tiny vocabulary (balanced stages): the
  // critical rank's bubble is (p - 1) / (m + p - 1) = 3/11 of the step, now that the time a stage
  // waits in the world-wide gradient-norm all-reduce for the others to drain counts as bubble
  // (summary.hpp; before, it was communication and the bubble came out at 9%).
  const scenarios::Scenario s = pure_pipeline(1, 8);
  SimOptions o;
  o.fidelity = Fidelity::analytic;
  const SimResult r = simulate(s, "auto", o);
  const profiler::WallBreakdown& w = *r.summary.steps.at(0).walls;
  const double step = r.summary.steps.at(0).step_time_us;
  // The 1F1B ideal assumes every micro-batch takes as long. With a profile that models NCCL
  // residency (nccl.interference) kernels run slower beside a posted pipeline receive, and a stage's
  // last micro-batches, after its last receive has arrived, run without one: not uniform, so the
  // bubble share sits below the ideal (0.248 with the 4 x H100 profile; within 0.02 of it without).
  EXPECT_NEAR(w.bubble_us / step, 3.0 / 11.0, 0.03);
  EXPECT_LT(w.communication_us / step, 0.01);
}

// Numbers of two JSON values that differ by more than `rel` (of the larger, at least 1), by path.
void differences(const Json& a, const Json& b, const std::string& path, double rel, std::string& out) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    if (!(std::fabs(x - y) <= rel * std::max({1.0, std::fabs(x), std::fabs(y)}))) {
      out += path + ": " + a.dump() + " against " + b.dump() + "\n";
    }
  } else if (a.is_object() && b.is_object() && a.size() == b.size()) {
    for (const auto& [k, v] : a.items()) {
      if (!b.contains(k))
        out += path + "/" + k + ": missing\n";
      else
        differences(v, b.at(k), path + "/" + k, rel, out);
    }
  } else if (a.is_array() && b.is_array() && a.size() == b.size()) {
    for (std::size_t i = 0; i < a.size(); ++i) differences(a[i], b[i], path + "/" + std::to_string(i), rel, out);
  } else if (a != b) {
    out += path + ": " + a.dump().substr(0, 80) + " against " + b.dump().substr(0, 80) + "\n";
  }
}

TEST(Simulator, FlowsAloneOutsideSimGridGiveSimGridsSteps) {
  // A flow alone on its links runs outside SimGrid until another flow shares one of them, at the
  // rate and to the date SimGrid gives a flow alone (docs/simulator.md, "Flows alone"). With and
  // without that shortcut the summaries (steps, walls, every phase's statistics) agree to a relative
  // 1e-8: a flow that enters SimGrid late carries the bytes it has left in whole bytes, and SimGrid
  // solves the sharing over its flows in another order. Examples where most flows run alone
  // (DeepSeek-V3 on 1,024 GPUs) and where most share (the 2,048-GPU one), and a small one.
  // And a link made slower in the middle of a run (the flows alone on it enter SimGrid).
  const fs::path examples = testing::source_dir() / "scenarios/examples";
  std::vector<std::pair<std::string, scenarios::Scenario>> cases;
  for (const char* name : {"deepseek_v3_1024gpu", "deepseek_v3_2048gpu", "small_moe_tp2_ep2"}) {
    cases.emplace_back(name, scenarios::load_scenario(examples / (std::string(name) + ".toml")));
  }
  cases.emplace_back("slow NVLink of rank 1 in step 1", from_text(small_moe("", R"(
[[cluster.slowdown]]
rank = 1
link = "nvlink"
factor = 4.0
from_step = 1
to_step = 1
)")));
  for (const auto& [name, s] : cases) {
    auto summary = [&](bool solo) {
      return in_child([&]() {
        SimOptions o;
        o.steps = s.cluster.slowdowns.empty() ? 1 : 3;
        o.solo_flows = solo;
        return simulate(s, "auto", o).summary_json.dump();
      });
    };
    const Json alone = Json::parse(summary(true));
    const Json all = Json::parse(summary(false));
    std::string out;
    differences(all, alone, "", 1e-8, out);
    EXPECT_EQ(out, "") << name;
    ASSERT_TRUE(alone.contains("step_time_us")) << name;
  }
}

TEST(Simulator, AStepsSteadyPeriodIsWhatAnotherRoundOfMicroBatchesAdds) {
  // Past the schedule's warm-up each round of micro-batches (pp of them with the interleaved
  // schedule, else one) adds one period to the step (the planner's re-simulations, docs/planner.md):
  // measured in the step of b micro-batches (SteadyRound, over the planner's rounds), it is the step
  // of b + round less the step of b, and the critical rank's walls over it add up to it.
  for (const int vpp : {1, 2}) {
    auto simulate_with = [&](int m, int round, int rounds = 1) {
      const scenarios::Scenario s = pure_pipeline(vpp, m);
      SimOptions o;
      o.fidelity = Fidelity::analytic;
      o.steady_round = round;
      o.steady_rounds = rounds;
      return simulate(s, "auto", o);
    };
    const int round = vpp > 1 ? 4 : 1;
    const int rounds = vpp > 1 ? 1 : 3;
    const int b = vpp > 1 ? 12 : 9;
    const SimResult short_step = simulate_with(b, round, rounds);
    const SimResult longer = simulate_with(b + round, 0);
    ASSERT_TRUE(short_step.steady_round) << "vpp " << vpp;
    EXPECT_FALSE(longer.steady_round);  // not asked for
    EXPECT_EQ(short_step.steady_round->microbatches, round);
    EXPECT_EQ(short_step.steady_round->rounds, rounds);
    const double grown = longer.summary.steps.at(0).step_time_us - short_step.summary.steps.at(0).step_time_us;
    EXPECT_NEAR(short_step.steady_round->period_us / grown, 1.0, 1e-3) << "vpp " << vpp;
    ASSERT_TRUE(short_step.steady_round->walls);
    EXPECT_NEAR(short_step.steady_round->walls->total_us() / short_step.steady_round->period_us, 1.0, 1e-9);
    // A round longer than the step has no period.
    EXPECT_FALSE(simulate_with(round, round).steady_round) << "vpp " << vpp;
  }
}

TEST(Simulator, BlackwellKindsSimulateFromSyntheticProfilesThatSayTheyAreNotMeasured) {
  // The same MoE step on 16 GPUs: H200 (two 8-GPU NVLink domains) and GB200 (one NVL72 domain holds
  // all 16: the EP all-to-all stays on NVLink). Blackwell's profiles are datasheet-scaled H200 facts:
  // the summary says so, and the step is faster.
  auto scenario = [](const std::string& gpu, int per_node, int nodes) {
    return from_text(R"(schema_version = 1
name = "blackwell"
[model]
num_layers = 4
hidden_size = 4096
num_attention_heads = 32
kv_channels = 128
vocab_size = 50304
num_experts = 64
moe_ffn_hidden_size = 2048
moe_router_topk = 8
[parallel]
ep = 16
[train]
micro_batch_size = 1
global_batch_size = 32
seq_length = 4096
[cluster]
gpu = ")" + gpu + R"("
gpus_per_node = )" + std::to_string(per_node) +
                     R"(
nodes = )" + std::to_string(nodes) +
                     R"(
[run]
steps = 1
)");
  };
  SimOptions o;
  o.fidelity = Fidelity::analytic;
  const SimResult h200 = simulate(scenario("h200", 8, 2), "auto", o);
  const SimResult gb200 = simulate(scenario("gb200", 16, 1), "auto", o);
  auto says_not_measured = [](const SimResult& r) {
    for (const auto& w : r.warnings) {
      if (w.find("is not a measurement") != std::string::npos && w.find("NOT MEASURED") != std::string::npos)
        return true;
    }
    return false;
  };
  EXPECT_FALSE(says_not_measured(h200));  // the shipped h200.toml is a measurement
  EXPECT_TRUE(says_not_measured(gb200));
  EXPECT_LT(gb200.summary.steps.at(0).step_time_us, 0.7 * h200.summary.steps.at(0).step_time_us);
  EXPECT_FALSE(gb200.memory.oom());
}

TEST(Simulator, ExpertParallelOverlapHidesPartOfTheDispatchAndCombine) {
  // An MoE model whose EP group spans two nodes (the all-to-all crosses the network): the combined
  // 1F1B step hides dispatch and combine behind the other micro-batch's compute, and delaying the
  // expert weight gradients hides the dispatch backward a little more. Neither can hide more than the
  // communication the step exposes without overlap.
  auto scenario = [](const std::string& train_extra) {
    return from_text(R"(schema_version = 1
name = "ep_overlap"
[model]
)" + test::olmoe_model_keys(4) +
                     R"([parallel]
ep = 4
[train]
micro_batch_size = 1
global_batch_size = 16
seq_length = 4096
)" + train_extra + R"(
[cluster]
gpu = "h200"
gpus_per_node = 2
nodes = 2
[run]
steps = 1
)");
  };
  auto run = [](const scenarios::Scenario& s) {
    SimOptions o;
    o.fidelity = Fidelity::analytic;
    const SimResult r = simulate(s, "auto", o);
    return std::make_pair(r.summary.steps.at(0).step_time_us, r.summary.steps.at(0).walls->communication_us);
  };
  const auto [base, base_comm] = run(scenario(""));
  const auto [overlap, overlap_comm] = run(scenario("overlap_moe_expert_parallel_comm = true"));
  const auto [delayed, delayed_comm] =
      run(scenario("overlap_moe_expert_parallel_comm = true\ndelay_wgrad_compute = true"));
  EXPECT_GT(base_comm / base, 0.4);  // the case is communication-bound without overlap
  EXPECT_LT(overlap, 0.9 * base);
  EXPECT_LE(delayed, overlap);
  EXPECT_LT(overlap_comm, 0.7 * base_comm);
  EXPECT_GT(overlap, base - base_comm);  // the hidden time is at most the exposed communication
}

}  // namespace
}  // namespace threewalls::sim

namespace threewalls::sim {
namespace {

// FP8 current scaling pays an amax pass before every cast: on one GPU, where every op runs on the
// compute stream and the step is device-bound, the step is longer than with delayed scaling (the
// amax recorded by the cast) by exactly the amax passes' cost on the profile. Unrecorded (profiler
// off): a recorded op also holds its stream for two timing markers.
using scenarios::OpKind;
using scenarios::StepGraph;
using testing::source_dir;

TEST(SimulatorFp8, CurrentScalingIsSlowerByItsAmaxPasses) {
  auto text = [](const std::string& recipe) {
    return "schema_version = 1\n[model]\nnum_layers = 2\nhidden_size = 2048\nnum_attention_heads = 16\n"
           "vocab_size = 32000\nnum_experts = 8\nmoe_ffn_hidden_size = 1024\nmoe_router_topk = 2\n"
           "[train]\nprecision = \"fp8\"\nfp8_recipe = \"" +
           recipe +
           "\"\nmicro_batch_size = 1\nglobal_batch_size = 2\nseq_length = 4096\n"
           "[cluster]\ngpu = \"h100\"\ngpus_per_node = 1\nnodes = 1\n[run.profiler]\nenabled = false\n"
           "[calibration]\nprofile = \"" +
           (source_dir() / "calibration" / "profiles" / "h100.toml").string() + "\"\n";
  };
  const scenarios::Scenario delayed = scenarios::load_scenario_text(text("delayed"), "delayed.toml").scenario;
  const scenarios::Scenario current = scenarios::load_scenario_text(text("tensorwise"), "current.toml").scenario;
  auto step_us = [](const scenarios::Scenario& s) {
    const std::string out = in_child([&]() {
      SimOptions o;
      o.fidelity = Fidelity::analytic;
      o.steps = 1;
      const SimResult r = simulate(s, "", o);
      return std::to_string(r.summary.step_time_us.median);
    });
    return std::stod(out);
  };
  const double slower_us = step_us(current) - step_us(delayed);
  // The amax passes of the tensorwise graph, costed alone.
  const calibration::CostModel model(
      calibration::Profile::load(source_dir() / "calibration" / "profiles" / "h100.toml"));
  const CostModelCoster coster(model);
  const StepGraph g = scenarios::expand(current);
  double amax_us = 0;
  int passes = 0;
  for (const auto& op : g.classes[0].ops) {
    if (op.kind == OpKind::elementwise && op.elementwise_kind() == scenarios::ElementwiseKind::amax) {
      amax_us += coster.kernel_time(op).value * 1e6;
      ++passes;
    }
  }
  // Per layer and micro-batch: 4 inputs and 4 output gradients; per layer the 4 bf16 weights once.
  EXPECT_EQ(passes, 2 * 2 * 8 + 2 * 4);
  ASSERT_GT(amax_us, 100.0);
  EXPECT_NEAR(slower_us, amax_us, 0.03 * amax_us)
      << "step longer by " << slower_us << " us, amax passes " << amax_us << " us";
}

}  // namespace
}  // namespace threewalls::sim
