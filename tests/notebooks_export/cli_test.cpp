// The compare / analyze / export subcommands of the threewalls binary: exit codes, outputs, errors.
#include <gtest/gtest.h>

#include <fstream>

#include "../support/models.hpp"
#include "../support/shell.hpp"
#include "test_util.hpp"
#include "threewalls/core/jsonl.hpp"
#include "threewalls/notebooks_export/analyze.hpp"

using namespace threewalls;
using namespace threewalls::notebooks_export;
using threewalls::notebooks_export::testing::fresh_dir;
namespace fs = std::filesystem;

namespace {

using test::threewalls_cli;
const std::string kBinary = test::threewalls_binary();

fs::path make_run(const std::string& suffix, double scale, int slow_rank = -1) {
  SyntheticSpec s;
  s.ranks = 4;
  s.steps = 4;
  s.layers = 2;
  s.microbatches = 2;
  s.time_scale = scale;
  s.slow_rank = slow_rank;
  s.slow_factor = 2;
  s.slow_phase = "attn_core_fwd";
  s.slow_from = 1;
  s.slow_to = 2;
  auto dir = fresh_dir(suffix);
  write_synthetic_run(dir, s);
  return dir;
}

}  // namespace

TEST(RunCommandsCli, CompareExitsOneAboveTheThresholdAndWritesJson) {
  ASSERT_TRUE(fs::exists(kBinary)) << kBinary;
  auto a = make_run("_a", 1.0);
  auto b = make_run("_b", 1.2);
  auto json = fresh_dir("_json") / "cmp.json";
  fs::create_directories(json.parent_path());
  std::string out;
  EXPECT_EQ(threewalls_cli("compare " + a.string() + " " + b.string() + " --fail-above 10 --json " + json.string(), out), 1)
      << out;
  EXPECT_NE(out.find("FAIL: step time (median) +"), std::string::npos) << out;
  Json j = read_json_file(json);
  EXPECT_EQ(j["failed"], true);
  EXPECT_EQ(threewalls_cli("compare " + a.string() + " " + b.string() + " --fail-above 25", out), 0) << out;
  EXPECT_NE(out.find("pass ("), std::string::npos) << out;
  EXPECT_EQ(threewalls_cli("compare " + a.string() + " " + b.string() + " --fail-above -3", out), 2) << out;
}

// A real run on one side, a simulation on the other: compare prints the real run's host probe
// against the simulation's profile, in the text and in the JSON, on whichever side the
// real run is; without a profile to read it says nothing.
TEST(RunCommandsCli, CompareReportsTheRealRunsHostProbeAgainstTheSimulationsProfile) {
  ASSERT_TRUE(fs::exists(kBinary)) << kBinary;
  SyntheticSpec spec;
  spec.ranks = 2;
  spec.steps = 2;
  spec.layers = 1;
  spec.microbatches = 1;
  spec.source = "real";
  auto real = fresh_dir("_real");
  write_synthetic_run(real, spec);
  spec.source = "sim";
  auto sim = fresh_dir("_sim");
  write_synthetic_run(sim, spec);
  const fs::path profile = fs::path(THREEWALLS_SOURCE_DIR) / "calibration" / "profiles" / "h100.toml";
  Json rj = read_json_file(real / "run.json");
  rj["settings"]["executor"]["device"]["host_probe"] = {{"op_launch_us", 10.0},
                                                        {"gemm_call_m64_n2560_k640_us", 20.0},
                                                        {"gemm_call_m128_n1024_k7168_us", 30.0}};
  std::ofstream(real / "run.json") << rj.dump();
  Json sj = read_json_file(sim / "run.json");
  std::ofstream(sim / "run.json.bare") << sj.dump();
  sj["calibration_profile"] = {{"id", "h100"}, {"path", profile.string()}, {"gpu", "h100"}};
  sj["settings"]["simulator"]["host_scale"] = 2.0;
  std::ofstream(sim / "run.json") << sj.dump();

  auto json = fresh_dir("_json") / "cmp.json";
  fs::create_directories(json.parent_path());
  std::string out;
  ASSERT_EQ(threewalls_cli("compare " + real.string() + " " + sim.string() + " --json " + json.string(), out), 0) << out;
  EXPECT_NE(out.find("host probe                 A 10.00 / 20.00 / 30.00 us"), std::string::npos) << out;
  const Json h = read_json_file(json)["host_probe"];
  ASSERT_TRUE(h.is_object()) << out;
  EXPECT_EQ(h["real_side"], "a");
  EXPECT_EQ(h["probe_us"], Json({10.0, 20.0, 30.0}));
  EXPECT_EQ(h["sim_host_scale"], 2.0);
  double charged = 0.0;
  for (const auto& v : h["charged_us"]) charged += v.get<double>();
  EXPECT_NEAR(h["scale"].get<double>(), 60.0 / charged, 1e-9);
  EXPECT_NEAR(h["host_scale_for_the_run"].get<double>(), 2.0 * 60.0 / charged, 1e-9);
  char suggested[32];
  std::snprintf(suggested, sizeof suggested, "--host-scale %.2f", 2.0 * 60.0 / charged);
  EXPECT_NE(out.find(suggested), std::string::npos) << out;

  ASSERT_EQ(threewalls_cli("compare " + sim.string() + " " + real.string() + " --json " + json.string(), out), 0) << out;
  EXPECT_EQ(read_json_file(json)["host_probe"]["real_side"], "b");
  const fs::path broken = fresh_dir("_broken") / "broken.toml";  // the profile broke since the simulation
  fs::create_directories(broken.parent_path());
  std::ofstream(broken) << "[profile\n";
  sj["calibration_profile"]["path"] = broken.string();
  std::ofstream(sim / "run.json") << sj.dump();
  ASSERT_EQ(threewalls_cli("compare " + real.string() + " " + sim.string() + " --json " + json.string(), out), 0) << out;
  EXPECT_TRUE(read_json_file(json)["host_probe"].is_null());
  EXPECT_NE(out.find("warning: host probe not compared"), std::string::npos) << out;
  fs::rename(sim / "run.json.bare", sim / "run.json");  // a simulation without a profile
  ASSERT_EQ(threewalls_cli("compare " + real.string() + " " + sim.string() + " --json " + json.string(), out), 0) << out;
  EXPECT_TRUE(read_json_file(json)["host_probe"].is_null());
  EXPECT_EQ(out.find("host probe"), std::string::npos) << out;
}

TEST(RunCommandsCli, AnalyzeNamesTheSlowRankPhaseAndSteps) {
  auto run = make_run("", 1.0, 3);
  std::string out;
  ASSERT_EQ(threewalls_cli("analyze " + run.string(), out), 0) << out;
  EXPECT_NE(out.find("rank 3 (stage 0)"), std::string::npos) << out;
  EXPECT_NE(out.find("bounded to steps 1..2"), std::string::npos) << out;
  EXPECT_NE(out.find("in attn_core_fwd (compute)"), std::string::npos) << out;
}

TEST(RunCommandsCli, ExportWritesEachFormatAndRefusesUnknownOnes) {
  auto run = make_run("", 1.0);
  auto out_dir = fresh_dir("_out");
  std::string out;
  EXPECT_EQ(threewalls_cli("export " + run.string() + " --format perfetto --out " + (out_dir / "t.json").string(), out), 0)
      << out;
  EXPECT_TRUE(fs::exists(out_dir / "t.json"));
  EXPECT_EQ(threewalls_cli("export " + run.string() + " --format csv --out " + (out_dir / "csv").string(), out), 0) << out;
  EXPECT_TRUE(fs::exists(out_dir / "csv" / "phases.csv"));
  EXPECT_EQ(threewalls_cli("export " + run.string() + " --format pdf --out x", out), 2);
  EXPECT_NE(out.find("unknown format \"pdf\"; allowed: perfetto, csv, notebook, html"), std::string::npos) << out;
  EXPECT_EQ(threewalls_cli("export " + run.string() + " --format perfetto --out " + (out_dir / "t.json").string(), out), 2);
  EXPECT_NE(out.find("exists; outputs are never overwritten"), std::string::npos) << out;
}

TEST(RunCommandsCli, ACorruptRunIsReportedByFileAndLine) {
  auto run = make_run("", 1.0);
  {
    std::ofstream f(run / "phases_rank_2.jsonl", std::ios::app);
    f << "{\"step\":9,\"rank\":2,\"pha";
  }
  std::string out;
  EXPECT_EQ(threewalls_cli("analyze " + run.string(), out), 2);
  EXPECT_NE(out.find("phases_rank_2.jsonl:"), std::string::npos) << out;
  EXPECT_NE(out.find("record after the footer"), std::string::npos) << out;
  // A run of a future major version is refused by name.
  auto future = make_run("_future", 1.0);
  std::string text;
  {
    std::ifstream in(future / "run.json");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  text.replace(text.find("\"1.2\""), 5, "\"2.0\"");
  std::ofstream(future / "run.json") << text;
  EXPECT_EQ(threewalls_cli("compare " + future.string() + " " + run.string(), out), 2);
  EXPECT_NE(out.find("version 2.0 is newer than this threewalls reads (1.x)"), std::string::npos) << out;
}

// End to end: the simulator with a [[cluster.slowdown]] on one rank for a step range, then analyze.
TEST(RunCommandsCli, AnalyzeFindsASlowdownInjectedIntoTheSimulator) {
  const fs::path dir = fresh_dir();
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "slow.toml");
    f << R"TOML(schema_version = 1
name = "small_moe_ep4_slow_rank2"
[model]
name = "OLMoE-1B-7B (4 layers)"
)TOML" << test::olmoe_model_keys(4)
      << R"TOML([parallel]
ep = 4
[train]
micro_batch_size = 1
global_batch_size = 8
seq_length = 4096
[cluster]
gpu = "h200"
gpus_per_node = 2
nodes = 2
[[cluster.slowdown]]
rank = 2
factor = 1.5
from_step = 3
to_step = 6
[run]
steps = 10
warmup_steps = 1
[run.profiler]
record_every_n_steps = 1
)TOML";
  }
  std::string out;
  ASSERT_EQ(threewalls_cli("sim " + (dir / "slow.toml").string() + " --out " + (dir / "run").string(), out), 0) << out;
  profiler::RunData run = profiler::RunDirReader::read(dir / "run");
  Analysis a = analyze_run(run);
  const SlowRank* s = find_slow_rank(a, 2);
  ASSERT_NE(s, nullptr) << format_analysis_text(a);
  EXPECT_EQ(a.slow_ranks.size(), 1U) << format_analysis_text(a);
  EXPECT_EQ(s->slow_steps, (std::vector<int>{3, 4, 5, 6})) << format_analysis_text(a);
  EXPECT_FALSE(s->persistent);
  ASSERT_FALSE(s->phases.empty());
  EXPECT_NEAR(*s->phases.front().excess_pct, 50.0, 1.0);  // the factor 1.5 on that GPU's kernels
}

namespace {

// A one-step small-MoE training run of `parallel` (the [parallel] keys) on one node of `gpus` H100,
// rank `slow` `factor` times slower, simulated with every rank recorded, then analysed.
Analysis analyze_one_slow_gpu(const std::string& name, const std::string& parallel, int gpus, int slow, double factor) {
  const fs::path dir = fresh_dir("_" + name);
  fs::create_directories(dir);
  std::ofstream(dir / "slow.toml") << "schema_version = 1\nname = \"" << name << "\"\n[model]\n"
                                   << test::small_moe_model_keys() << "[parallel]\n"
                                   << parallel << R"TOML([train]
micro_batch_size = 1
global_batch_size = 16
seq_length = 1024
[cluster]
gpu = "h100"
nodes = 1
)TOML"
                                   << "gpus_per_node = " << gpus << "\n[[cluster.slowdown]]\nrank = " << slow
                                   << "\nfactor = " << factor
                                   << "\n[run]\nsteps = 1\n[run.profiler]\nranks = \"all\"\n";
  std::string out;
  EXPECT_EQ(threewalls_cli("sim " + (dir / "slow.toml").string() + " --out " + (dir / "run").string(), out), 0) << out;
  return analyze_run(profiler::RunDirReader::read(dir / "run"));
}

}  // namespace

// A slow rank in a layout of several group kinds (TP2 PP2 EP2 on 8 GPUs, where the expansion refines
// the classes of the ranks that wait for it): the step completes and analyze names that rank first.
TEST(RunCommandsCli, AnalyzeNamesASlowRankOfATensorPipelineExpertLayout) {
  const Analysis a =
      analyze_one_slow_gpu("slow_tp_pp_ep", "tp = 2\npp = 2\nep = 2\nsequence_parallel = true\n", 8, 5, 3.0);
  ASSERT_FALSE(a.slow_ranks.empty()) << format_analysis_text(a);
  EXPECT_EQ(a.slow_ranks.front().rank, 5) << format_analysis_text(a);
}

// Two data-parallel pipelines, one slow GPU: the stage behind it waits in its pipeline receives, which
// is not its own time, so analyze names the slow rank only (its pipeline neighbour's step is as long).
TEST(RunCommandsCli, AnalyzeDoesNotBlameThePipelineNeighboursOfASlowRank) {
  const Analysis a = analyze_one_slow_gpu("slow_pp_dp", "pp = 2\n", 4, 0, 3.0);
  ASSERT_EQ(a.slow_ranks.size(), 1U) << format_analysis_text(a);
  EXPECT_EQ(a.slow_ranks.front().rank, 0) << format_analysis_text(a);
  // Its own kernels lead its phases (3x), not its receives' waits for the stage it slows down.
  ASSERT_FALSE(a.slow_ranks.front().phases.empty());
  const PhaseExcess& first = a.slow_ranks.front().phases.front();
  EXPECT_EQ(first.wall, profiler::Wall::compute) << format_analysis_text(a);
  ASSERT_TRUE(first.excess_pct.has_value());
  EXPECT_GT(*first.excess_pct, 150.0) << format_analysis_text(a);  // 3x kernels; its records hold markers too
}

// The Perfetto export of a simulated pipeline: no two slices of one track overlap (in the file's
// integer nanoseconds), every recorded send has a flow to the receive it delivers to, and each
// recorded rank has a memory counter.
TEST(RunCommandsCli, PerfettoOfASimulatedPipelineHasNoOverlapsAndAFlowPerSend) {
  const fs::path dir = fresh_dir("_perfetto_pp");
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "pp.toml");
    f << R"TOML(schema_version = 1
name = "perfetto_pp"
[model]
)TOML" << test::small_moe_model_keys()
      << R"TOML([parallel]
pp = 2
[train]
micro_batch_size = 1
global_batch_size = 4
seq_length = 1024
[cluster]
gpu = "h100"
gpus_per_node = 2
nodes = 1
[run]
steps = 2
warmup_steps = 0
[run.profiler]
record_every_n_steps = 1
)TOML";
  }
  std::string out;
  ASSERT_EQ(threewalls_cli("sim " + (dir / "pp.toml").string() + " --out " + (dir / "run").string(), out), 0) << out;
  ASSERT_EQ(threewalls_cli(
                "export " + (dir / "run").string() + " --format perfetto --out " + (dir / "trace.json").string(), out),
            0)
      << out;
  const Json j = read_json_file(dir / "trace.json");
  struct Slice {
    long long start, end;
    std::string name;
  };
  const auto ns = [](const Json& v) { return std::llround(v.get<double>() * 1000.0); };
  std::map<std::pair<long long, long long>, std::vector<Slice>> tracks;
  std::map<long long, std::pair<const Json*, const Json*>> flows;  // id -> (s, f)
  std::set<long long> counter_pids;
  for (const auto& e : j.at("traceEvents")) {
    const std::string ph = e.at("ph");
    const auto track = std::make_pair(e.at("pid").get<long long>(), e.at("tid").get<long long>());
    if (ph == "X") tracks[track].push_back({ns(e.at("ts")), ns(e.at("ts")) + ns(e.at("dur")), e.at("name")});
    if (ph == "s") flows[e.at("id").get<long long>()].first = &e;
    if (ph == "f") flows[e.at("id").get<long long>()].second = &e;
    if (ph == "C") counter_pids.insert(track.first);
  }
  // Slices of one track nest or follow each other.
  std::size_t sends = 0;
  for (auto& [track, slices] : tracks) {
    std::sort(slices.begin(), slices.end(),
              [](const Slice& a, const Slice& b) { return a.start != b.start ? a.start < b.start : a.end > b.end; });
    std::vector<long long> open;  // ends of the enclosing slices
    for (const Slice& s : slices) {
      while (!open.empty() && open.back() <= s.start) open.pop_back();
      ASSERT_TRUE(open.empty() || s.end <= open.back())
          << "pid " << track.first << " tid " << track.second << ": " << s.name << " [" << s.start << ", " << s.end
          << ") overlaps a slice ending at " << open.back();
      open.push_back(s.end);
      if (s.name.rfind("pp_send", 0) == 0) ++sends;
    }
  }
  // Each flow starts inside a send and ends inside a receive of the peer's process.
  const auto inside = [&](const Json& e, const std::string& prefix) {
    const auto& slices = tracks[{e.at("pid").get<long long>(), e.at("tid").get<long long>()}];
    const long long t = ns(e.at("ts"));
    return std::any_of(slices.begin(), slices.end(),
                       [&](const Slice& s) { return s.start <= t && t <= s.end && s.name.rfind(prefix, 0) == 0; });
  };
  ASSERT_GT(sends, 0U);
  EXPECT_EQ(flows.size(), sends);
  for (const auto& [id, sf] : flows) {
    ASSERT_NE(sf.first, nullptr) << id;
    ASSERT_NE(sf.second, nullptr) << id;
    EXPECT_TRUE(inside(*sf.first, "pp_send")) << sf.first->dump();
    EXPECT_TRUE(inside(*sf.second, "pp_recv")) << sf.second->dump();
    EXPECT_NE(sf.first->at("pid"), sf.second->at("pid")) << id;
  }
  EXPECT_EQ(counter_pids, (std::set<long long>{0, 1}));
}
