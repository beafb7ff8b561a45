// The executor's scheduling, the profiler's sampling and the fault handling, on the fake device
// (backend/include/threewalls/backend/fake_device.hpp): no GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include <unistd.h>

#include "threewalls/backend/executor.hpp"
#include "threewalls/backend/fake_device.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/step_graph.hpp"
#include "placement.hpp"

namespace threewalls::backend {
namespace {

namespace fs = std::filesystem;
using scenarios::Op;
using scenarios::OpKind;
using scenarios::Scenario;
using scenarios::StepGraph;

// A small MoE: 2 layers, 4 experts, short sequences (a step is a few milliseconds on the fake device).
std::string small_moe(const std::string& parallel, const std::string& train_extra, int gpus,
                      const std::string& run_extra = "", const std::string& model_extra = "", int layers = 2) {
  return "schema_version = 1\nname = \"exec_test\"\n[model]\nnum_layers = " + std::to_string(layers) +
         "\nhidden_size = 256\n"
         "num_attention_heads = 4\nvocab_size = 1024\nnum_experts = 4\nmoe_ffn_hidden_size = 256\n"
         "moe_router_topk = 2\n" +
         model_extra + "\n[parallel]\n" + parallel + "\n[train]\nmicro_batch_size = 1\nglobal_batch_size = " +
         std::to_string(2 * gpus) + "\nseq_length = 256\n" + train_extra + "\n[cluster]\ngpu = \"h100\"\ngpus_per_node = " +
         std::to_string(gpus) + "\nnodes = 1\n[run]\nsteps = 3\nwarmup_steps = 1\n" + run_extra;
}

Scenario scenario_from(const std::string& text) { return scenarios::load_scenario_text(text, "exec_test.toml").scenario; }

fs::path temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("tw_exec_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

struct FakeRun {
  RunResult result;
  std::vector<FakeTraceEntry> trace;
  double seconds = 0.0;
};

FakeDeviceOptions quick() {
  FakeDeviceOptions o;
  o.flops_per_us = 2e7;
  o.bytes_per_us = 2e5;
  o.link_bytes_per_us = 1e5;
  o.min_op_us = 2.0;
  o.max_op_us = 400.0;
  return o;
}

FakeRun run_fake(const Scenario& s, const ExecutorOptions& eo, const FakeDeviceOptions& fo = quick()) {
  FakeFabric fabric(fo);
  ProcessContext pc;
  for (int r = 0; r < s.world_size(); ++r) pc.local_ranks.push_back(r);
  pc.make_comm_ids = [&fabric](std::size_t n) { return fabric.make_ids(n); };
  pc.host_now_us = [&fabric] { return fabric.now_us(); };
  const DeviceFactory factory = [&fabric](int rank, int) { return std::make_unique<FakeDevice>(fabric, rank); };
  const auto t0 = std::chrono::steady_clock::now();
  FakeRun out;
  out.result = execute(s, pc, factory, eo);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.trace = fabric.trace();
  return out;
}

ExecutorOptions options_for(const fs::path& dir, int steps = 3, int warmup = 1) {
  ExecutorOptions o;
  o.out_dir = dir;
  o.steps = steps;
  o.warmup_steps = warmup;
  o.timeout = std::chrono::seconds(20);
  return o;
}

using Key = std::tuple<int, int, std::string, int, int, int>;  // step, rank, phase, layer, microbatch, expert

// The keys a run must record: every op of the rank's class, for every recorded step.
std::set<Key> expected_keys(const StepGraph& g, const std::vector<int>& ranks, const std::vector<int>& steps,
                            bool coarse = false) {
  std::set<Key> keys;
  for (int step : steps) {
    for (int r : ranks) {
      for (const Op& op : g.class_of(r).ops) {
        if (coarse && (op.flags & (scenarios::kDataLoad | scenarios::kMetrics)) == 0) continue;
        keys.emplace(step, r, g.phase_name(op), op.layer, op.microbatch, op.expert);
      }
    }
  }
  return keys;
}

std::set<Key> recorded_keys(const profiler::RunData& d) {
  std::set<Key> keys;
  for (const auto& p : d.phases) {
    keys.emplace(p.step, p.rank, d.names.phases.name(p.phase), p.layer, p.microbatch, p.expert);
  }
  return keys;
}

std::string diff(const std::set<Key>& a, const std::set<Key>& b) {
  std::string out;
  int n = 0;
  for (const Key& k : a) {
    if (b.count(k) == 0 && n++ < 10) {
      out += "  missing " + std::get<2>(k) + " step " + std::to_string(std::get<0>(k)) + " rank " +
             std::to_string(std::get<1>(k)) + " layer " + std::to_string(std::get<3>(k)) + " mb " +
             std::to_string(std::get<4>(k)) + " expert " + std::to_string(std::get<5>(k)) + "\n";
    }
  }
  for (const Key& k : b) {
    if (a.count(k) == 0 && n++ < 20) out += "  extra " + std::get<2>(k) + " step " + std::to_string(std::get<0>(k)) + "\n";
  }
  return out;
}

// Occurrence k of (rank, op) in the trace is iteration k (warm-up steps included).
std::map<std::tuple<int, std::uint32_t, int>, FakeTraceEntry> by_iteration(const std::vector<FakeTraceEntry>& trace) {
  std::map<std::pair<int, std::uint32_t>, int> count;
  std::map<std::tuple<int, std::uint32_t, int>, FakeTraceEntry> out;
  for (const auto& e : trace) {
    const int k = count[{e.rank, e.op}]++;
    out[{e.rank, e.op, k}] = e;
  }
  return out;
}

// Every executed op started after its deps (device ops) ended, and after the previous op of its
// stream, in the same iteration.
void expect_dependencies_respected(const StepGraph& g, const std::vector<FakeTraceEntry>& trace, int iterations) {
  const auto it = by_iteration(trace);
  std::size_t checked = 0;
  for (int r = 0; r < g.layout.world(); ++r) {
    const auto& rc = g.class_of(r);
    for (int k = 0; k < iterations; ++k) {
      std::map<int, double> stream_end;
      for (std::uint32_t i = 0; i < rc.ops.size(); ++i) {
        const Op& op = rc.ops[i];
        const auto e = it.find({r, i, k});
        if (op.kind == OpKind::host) continue;
        ASSERT_NE(e, it.end()) << "rank " << r << " op " << i << " (" << g.phase_name(op) << ") did not run in iteration " << k;
        for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
          const auto de = it.find({r, rc.deps_of(op)[d], k});
          if (de == it.end()) continue;  // a host op
          EXPECT_GE(e->second.start_us + 1.0, de->second.end_us)
              << "rank " << r << " " << g.phase_name(op) << " layer " << op.layer << " started before its dep "
              << g.phase_name(rc.ops[rc.deps_of(op)[d]]);
          ++checked;
        }
        auto& se = stream_end[op.stream];
        auto p2p = [](const Op& o) { return o.kind == OpKind::send || o.kind == OpKind::recv; };
        // Adjacent send/recv ops of a stream are one NCCL group: they start together.
        const bool grouped = i > 0 && p2p(op) && p2p(rc.ops[i - 1]) && rc.ops[i - 1].stream == op.stream;
        if (!grouped) {
          EXPECT_GE(e->second.start_us + 1.0, se) << "rank " << r << " " << g.phase_name(op) << " (op " << i << ", iteration " << k << ") overtook its stream";
        }
        se = std::max(se, e->second.end_us);
      }
    }
  }
  EXPECT_GT(checked, 0U);
}

TEST(Executor, RecordKeysMatchTheStepGraphOnEveryRank) {
  const fs::path dir = temp_dir("keys");
  const Scenario s = scenario_from(small_moe("ep = 2", "", 2, "[run.profiler]\nrecord_every_n_steps = 1\n"));
  const FakeRun run = run_fake(s, options_for(dir));
  const profiler::RunData d = profiler::RunDirReader::read(dir);
  const StepGraph g = scenarios::expand(s, 0);
  EXPECT_EQ(d.header.source, "real");
  EXPECT_EQ(d.header.device, "fake device");
  const auto want = expected_keys(g, {0, 1}, {0, 1, 2});
  const auto got = recorded_keys(d);
  EXPECT_EQ(want, got) << diff(want, got);
  // Optional fields exactly where the simulator writes them.
  for (const auto& p : d.phases) {
    const std::string phase = d.names.phases.name(p.phase);
    if (p.wall == profiler::Wall::communication) {
      EXPECT_NE(p.group, profiler::kNoName) << phase;
      // Collectives name their group instance by its lowest rank (here: the EP group {0, 1}).
      if (p.peer == profiler::kAbsent && d.names.groups.name(p.group) == "ep") {
        EXPECT_EQ(p.group_id, 0) << phase;
      }
    }
    EXPECT_GE(p.dur_us, 0.0) << phase;
    EXPECT_GE(p.start_us, -50.0) << phase;  // host ops are aligned on the host clock
  }
  ASSERT_EQ(d.steps.size(), 6U);  // 3 steps x 2 ranks
  for (const auto& st : d.steps) EXPECT_GT(st.dur_us, 0.0);
  ASSERT_TRUE(d.summary.has_value());
  EXPECT_TRUE((*d.summary)["memory"].contains("measured_peak_bytes_by_rank"));
  EXPECT_EQ((*d.summary)["memory"]["measured_peak_bytes_by_rank"].size(), 2U);
  EXPECT_GT(run.result.mean_step_us, 0.0);
  fs::remove_all(dir);
}

TEST(Executor, OpsRunAfterTheirDependenciesAcrossStreams) {
  const fs::path dir = temp_dir("deps");
  // Shared experts on their own stream, gradient reduction overlapped on dp_comm, experts on 2 streams.
  const Scenario s = scenario_from(small_moe(
      "ep = 2", "overlap_grad_reduce = true\nmoe_shared_expert_overlap = true\nexpert_execution = \"streams:2\"\n", 2,
      "[run.profiler]\nrecord_every_n_steps = 1\n", "moe_shared_expert_intermediate_size = 256\n"));
  const StepGraph g = scenarios::expand(s, 0);
  std::set<std::string> streams;
  for (const auto& st : g.streams) streams.insert(st.name);
  ASSERT_TRUE(streams.count("shared_expert") && streams.count("dp_comm") && streams.count("expert_1"));
  const FakeRun run = run_fake(s, options_for(dir, 2, 1));
  expect_dependencies_respected(g, run.trace, 3);
  fs::remove_all(dir);
}

TEST(Executor, PipelineSendAndRecvMatchAcrossStagesWithInterleaving) {
  const fs::path dir = temp_dir("pp");
  const Scenario s =
      scenario_from(small_moe("pp = 2\nvpp = 2", "", 2, "[run.profiler]\nrecord_every_n_steps = 1\n", "", 4));
  const StepGraph g = scenarios::expand(s, 0);
  const auto instances = comm_instances({&g});
  std::set<std::string> names;
  for (const auto& ci : instances) names.insert(ci.key);
  // Activations and gradients, and each direction between two ranks, have their own communicator.
  for (const char* key : {"pp@pp_fwd:0>1", "pp@pp_fwd:1>0", "pp@pp_bwd:0>1", "pp@pp_bwd:1>0"}) {
    EXPECT_TRUE(names.count(key)) << key;
  }
  const FakeRun run = run_fake(s, options_for(dir, 2, 1));
  expect_dependencies_respected(g, run.trace, 3);
  const profiler::RunData d = profiler::RunDirReader::read(dir);
  std::size_t p2p = 0;
  for (const auto& p : d.phases) {
    if (p.peer == profiler::kAbsent) continue;
    ++p2p;
    EXPECT_EQ(p.peer, 1 - p.rank) << "with pp = 2 the peer stage is the other rank";
  }
  EXPECT_GT(p2p, 0U);
  fs::remove_all(dir);
}

TEST(Executor, CudaGraphRunsAreCapturedOnceAndTimedPerOp) {
  const fs::path dir = temp_dir("graphs");
  const Scenario s = scenario_from(small_moe("ep = 2", "cuda_graph_scope = [\"attn\", \"moe_router\"]\n", 2,
                                             "[run.profiler]\nrecord_every_n_steps = 1\n"));
  const StepGraph g = scenarios::expand(s, 0);
  ASSERT_FALSE(g.class_of(0).graph_runs.empty());
  const FakeRun run = run_fake(s, options_for(dir, 3, 1));
  std::size_t in_graph = 0;
  for (const auto& e : run.trace) in_graph += e.in_graph ? 1 : 0;
  EXPECT_GT(in_graph, 0U) << "graph runs replay captured work";
  expect_dependencies_respected(g, run.trace, 4);
  const profiler::RunData d = profiler::RunDirReader::read(dir);
  const auto want = expected_keys(g, {0, 1}, {0, 1, 2});
  EXPECT_EQ(want, recorded_keys(d)) << diff(want, recorded_keys(d));
  fs::remove_all(dir);
}

TEST(Executor, SamplingRecordsEveryNthStepOnTheSelectedRanks) {
  const fs::path dir = temp_dir("sampling");
  const Scenario s = scenario_from(small_moe("ep = 2", "", 2,
                                             "[run.profiler]\nrecord_every_n_steps = 2\nstart_step = 1\nranks = [1]\n"));
  ExecutorOptions eo = options_for(dir, 5, 1);
  run_fake(s, eo);
  const profiler::RunData d = profiler::RunDirReader::read(dir);
  EXPECT_TRUE(fs::exists(dir / "phases_rank_1.jsonl"));
  EXPECT_FALSE(fs::exists(dir / "phases_rank_0.jsonl"));
  std::set<int> steps;
  for (const auto& p : d.phases) {
    EXPECT_EQ(p.rank, 1);
    steps.insert(p.step);
  }
  EXPECT_EQ(steps, (std::set<int>{1, 3}));
  fs::remove_all(dir);
}

TEST(Executor, CoarseGranularityRecordsOnlyTheCoarseView) {
  const fs::path dir = temp_dir("coarse");
  const Scenario s = scenario_from(small_moe("ep = 2", "", 2, "[run.profiler]\nrecord_every_n_steps = 1\ngranularity = \"coarse\"\n"));
  run_fake(s, options_for(dir, 2, 0));
  const profiler::RunData d = profiler::RunDirReader::read(dir);
  const StepGraph g = scenarios::expand(s, 0);
  const auto want = expected_keys(g, {0, 1}, {0, 1}, true);
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(want, recorded_keys(d)) << diff(want, recorded_keys(d));
  ASSERT_EQ(d.steps.size(), 4U);
  for (const auto& st : d.steps) EXPECT_GT(st.dur_us, 0.0) << "the step time comes from the step's end marker";
  fs::remove_all(dir);
}

TEST(Executor, DisabledProfilerWritesNothing) {
  const fs::path dir = temp_dir("disabled");
  const Scenario s = scenario_from(small_moe("ep = 2", "", 2, "[run.profiler]\nenabled = false\n"));
  const FakeRun run = run_fake(s, options_for(dir, 2, 0));
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_FALSE(run.result.recorded);
  EXPECT_GT(run.result.mean_step_us, 0.0) << "the host still times the loop";
}

TEST(Executor, RecordedTimesFollowTheDeviceTimeline) {
  const fs::path dir = temp_dir("times");
  const Scenario s = scenario_from(small_moe("tp = 1", "", 1, "[run.profiler]\nrecord_every_n_steps = 1\n"));
  FakeDeviceOptions fo = quick();
  fo.min_op_us = 500.0;  // long ops: sleep jitter (up to ~0.3 ms seen on a loaded 2-core CI) is small against them
  const FakeRun run = run_fake(s, options_for(dir, 1, 0), fo);
  const profiler::RunData d = profiler::RunDirReader::read(dir);
  ASSERT_EQ(d.steps.size(), 1U);
  const double epoch = d.steps.front().epoch_us;
  const StepGraph g = scenarios::expand(s, 0);
  const auto& ops = g.class_of(0).ops;
  std::map<Key, std::pair<double, double>> rec;
  for (const auto& p : d.phases) {
    rec[{p.step, p.rank, d.names.phases.name(p.phase), p.layer, p.microbatch, p.expert}] = {epoch + p.start_us, p.dur_us};
  }
  std::vector<testing::Placed> placed;
  for (const auto& e : run.trace) {
    const Op& op = ops[e.op];
    const auto it = rec.find({0, 0, g.phase_name(op), op.layer, op.microbatch, op.expert});
    ASSERT_NE(it, rec.end());
    // Markers sit right around the op on its stream: within the fake device's scheduling noise
    // (sleeps overshoot under load), well below one op's 0.5 ms; placement.hpp on the common offset.
    placed.push_back({it->second.first, it->second.second, e.start_us, e.end_us - e.start_us, g.phase_name(op)});
  }
  testing::expect_records_follow_the_trace(placed, "one step");
  fs::remove_all(dir);
}

// A launch-bound step: every launch holds the host for 2 ms while each op runs 0.1 ms, so the stream
// has reached each op's start marker long before the launch call returns. The records carry that
// wait (launch_wait_us, the host's launch return minus the record's start) and the wall sweep counts
// it as host; with instant launches and long ops the waits are near zero and compute dominates.
TEST(Executor, LaunchBoundRecordsCarryTheirLaunchWaitAndTheHostWallShowsIt) {
  const Scenario s = scenario_from(small_moe("tp = 1", "", 1, "[run.profiler]\nrecord_every_n_steps = 1\n", "", 1));
  auto measure = [&](const std::string& name, const FakeDeviceOptions& fo) {
    const fs::path dir = temp_dir(name);
    run_fake(s, options_for(dir, 1, 0), fo);
    const profiler::RunData d = profiler::RunDirReader::read(dir);
    std::vector<double> frac;  // launch_wait_us of the compute and memory records
    for (const auto& p : d.phases) {
      if (p.wall == profiler::Wall::compute || p.wall == profiler::Wall::memory) {
        EXPECT_LE(static_cast<double>(p.launch_wait_us), p.dur_us + 1e-3) << d.names.phases.name(p.phase);
        frac.push_back(static_cast<double>(p.launch_wait_us));
      }
    }
    EXPECT_GT(frac.size(), 10U);
    std::sort(frac.begin(), frac.end());
    const double median_wait = frac[frac.size() / 2];
    const auto& w = (*d.summary)["walls_us"];
    const double total = w["compute"].get<double>() + w["memory"].get<double>() + w["communication"].get<double>() +
                         w["host"].get<double>() + w["bubble"].get<double>();
    fs::remove_all(dir);
    return std::make_pair(median_wait, w["host"].get<double>() / total);
  };
  FakeDeviceOptions bound = quick();
  bound.min_op_us = 100.0;
  bound.max_op_us = 100.0;
  bound.launch_host_us = 2000.0;
  const auto [wait_bound, host_bound] = measure("launch_bound", bound);
  EXPECT_GT(wait_bound, 1000.0) << "the device waited most of each 2 ms launch";
  EXPECT_GT(host_bound, 0.6) << "a launch-bound step is mostly host wall";

  FakeDeviceOptions busy = quick();
  busy.min_op_us = 1500.0;
  busy.max_op_us = 1500.0;
  const auto [wait_busy, host_busy] = measure("device_bound", busy);
  EXPECT_LT(wait_busy, 300.0) << "the host runs ahead of a busy device: no launch wait";
  EXPECT_LT(host_busy, 0.3);
}

// The fault tests' run: expert parallelism over two ranks recording every step, with `eo` on the fake
// device `fo`, expected to fail with a SystemError. The error's text and the seconds until it came
// (the run directory eo.out_dir is removed); a run that succeeds is a test failure.
struct Failure {
  std::string message;
  double seconds = 0.0;
};
Failure failed_run(const ExecutorOptions& eo, const FakeDeviceOptions& fo) {
  const Scenario s = scenario_from(small_moe("ep = 2", "", 2, "[run.profiler]\nrecord_every_n_steps = 1\n"));
  const auto t0 = std::chrono::steady_clock::now();
  Failure f;
  try {
    run_fake(s, eo, fo);
    ADD_FAILURE() << "expected a failure";
  } catch (const SystemError& e) {
    f.message = e.what();
  }
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fs::remove_all(eo.out_dir);
  return f;
}

TEST(Executor, AFailingRankStopsEveryRankWithAClearError) {
  const fs::path dir = temp_dir("fail");
  FakeDeviceOptions fo = quick();
  fo.fail_rank = 1;
  fo.fail_at_launch = 150;
  ExecutorOptions eo = options_for(dir, 3, 1);
  eo.timeout = std::chrono::seconds(60);  // the others must stop because rank 1 failed, not time out
  const auto [m, seconds] = failed_run(eo, fo);
  EXPECT_EQ(m.rfind("rank 1: fake device: injected failure at launch 150", 0), 0U) << m;
  EXPECT_NE(m.find("rank 0: stopped"), std::string::npos) << m;
  EXPECT_NE(m.find("after rank 1 failed"), std::string::npos) << m;
  EXPECT_LT(seconds, 20.0);
}

TEST(Executor, AHungPeerMakesTheOthersTimeOutInsteadOfHanging) {
  const fs::path dir = temp_dir("hang");
  FakeDeviceOptions fo = quick();
  fo.hang_rank = 1;
  fo.hang_at_comm = 5;
  ExecutorOptions eo = options_for(dir, 2, 1);
  eo.timeout = std::chrono::milliseconds(400);
  const auto [m, seconds] = failed_run(eo, fo);
  EXPECT_NE(m.find("no progress for 0.4 s waiting for"), std::string::npos) << m;
  EXPECT_NE(m.find("communicators are aborted"), std::string::npos) << m;
  EXPECT_LT(seconds, 15.0);
}

// A rank thread blocked inside a device call polls nothing: here every launch waits for room in a
// four-command launch queue (as CUDA's bounded launch queue does) behind a collective that cannot
// complete. The main thread's watchdog finds the thread that stands still, stops the run and aborts
// the blocked devices' communicators, so every rank stops well within the timeout plus 5 s and none
// is given up on.
TEST(Executor, RanksBlockedInALaunchBehindAHungCollectiveAreFoundAndStopped) {
  const fs::path dir = temp_dir("blocked_hang");
  FakeDeviceOptions fo = quick();
  fo.hang_rank = 1;
  fo.hang_at_comm = 5;
  fo.launch_queue_depth = 4;
  ExecutorOptions eo = options_for(dir, 2, 1);
  eo.timeout = std::chrono::milliseconds(400);
  eo.stop_grace = std::chrono::seconds(20);
  const auto [m, seconds] = failed_run(eo, fo);
  EXPECT_NE(m.find("no progress for 1.4"), std::string::npos) << m;
  EXPECT_NE(m.find("inside a device call"), std::string::npos) << m;
  EXPECT_EQ(m.find("did not stop"), std::string::npos) << m;
  EXPECT_LT(seconds, 5.4);
}

TEST(Executor, ARankBlockedInALaunchStopsSoonAfterItsPeerFails) {
  const fs::path dir = temp_dir("blocked_fail");
  FakeDeviceOptions fo = quick();
  fo.fail_rank = 1;
  fo.fail_at_launch = 220;  // rank 1's dispatch of layer 1, which rank 0's stream then waits on for ever
  fo.launch_queue_depth = 4;
  ExecutorOptions eo = options_for(dir, 3, 1);
  eo.timeout = std::chrono::seconds(60);  // the others must stop because rank 1 failed, not time out
  eo.stop_grace = std::chrono::seconds(20);
  const auto [m, seconds] = failed_run(eo, fo);
  EXPECT_EQ(m.rfind("rank 1: fake device: injected failure at launch 220", 0), 0U) << m;
  EXPECT_NE(m.find("rank 0: stopped"), std::string::npos) << m;
  EXPECT_EQ(m.find("did not stop"), std::string::npos) << m;
  EXPECT_LT(seconds, 5.0) << "a blocked rank is aborted 1 s after the stop, not given up on after 20 s";
}

TEST(Executor, InjectedFaultsStopTheRunWithAClearError) {
  const Scenario s = scenario_from(small_moe("ep = 2", "", 2));
  for (const auto fault : {ExecutorOptions::Fault::fail, ExecutorOptions::Fault::hang}) {
    const fs::path dir = temp_dir("inject");
    ExecutorOptions eo = options_for(dir, 3, 1);
    eo.fault = fault;
    eo.fault_rank = 1;
    eo.fault_step = 1;
    eo.timeout = std::chrono::milliseconds(500);
    try {
      run_fake(s, eo);
      FAIL() << "expected a failure";
    } catch (const SystemError& e) {
      const std::string m = e.what();
      if (fault == ExecutorOptions::Fault::fail) {
        EXPECT_EQ(m.rfind("rank 1: injected failure (--inject-fault) in step 1 before op", 0), 0U) << m;
        EXPECT_NE(m.find("rank 0: stopped"), std::string::npos) << m;
      } else {
        // The hung rank raises nothing: its peer times out in a collective and stops the run.
        EXPECT_EQ(m.rfind("rank 0: no progress for 0.5 s", 0), 0U) << m;
        EXPECT_NE(m.find("rank 1: injected hang (--inject-fault) in step 1"), std::string::npos) << m;
      }
    }
    fs::remove_all(dir);
  }
}

TEST(Executor, MismatchedCollectivesAreReportedNotHung) {
  // Two ranks that do not issue the same collective at the same position: the fake fabric checks
  // what NCCL would silently hang on.
  FakeFabric fabric(quick());
  FakeFabric::Arrival a{0, "moe_dispatch_fwd layer 0", 1.0};
  FakeFabric::Arrival b{1, "moe_combine_fwd layer 0", 1.0};
  std::thread t([&] { EXPECT_THROW(fabric.rendezvous("k", 2, a, [] { return false; }), SystemError); });
  try {
    fabric.rendezvous("k", 2, b, [] { return false; });
    FAIL();
  } catch (const SystemError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("issued moe_dispatch_fwd layer 0"), std::string::npos) << m;
    EXPECT_NE(m.find("issued moe_combine_fwd layer 0"), std::string::npos) << m;
    EXPECT_NE(m.find("in the same order"), std::string::npos) << m;
  }
  t.join();
}

TEST(Executor, RefusesAnExistingRunDirectoryBeforeUsingDevices) {
  const fs::path dir = temp_dir("exists");
  fs::create_directories(dir);
  {
    std::FILE* f = std::fopen((dir / "run.json").c_str(), "w");
    std::fputs("{\"schema\": \"threewalls.run_dir\"}", f);
    std::fclose(f);
  }
  const Scenario s = scenario_from(small_moe("tp = 1", "", 1));
  try {
    run_fake(s, options_for(dir, 1, 0));
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("results are never overwritten"), std::string::npos) << e.what();
  }
  ExecutorOptions eo = options_for(dir, 1, 0);
  eo.overwrite = true;
  EXPECT_NO_THROW(run_fake(s, eo));
  fs::remove_all(dir);
}

TEST(Executor, RefusesSlowdownsItCannotEmulate) {
  const Scenario s = scenario_from(small_moe("ep = 2", "", 2) + "[[cluster.slowdown]]\nrank = 1\nfactor = 2.0\n");
  try {
    run_fake(s, options_for(temp_dir("slow"), 1, 0));
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cluster.slowdown"), std::string::npos) << e.what();
  }
}

TEST(Executor, RefusesParameterPrecisionsItDoesNotHold) {
  // The backend's parameter state is bf16 weights, an fp32 gradient buffer and fp32 Adam state.
  for (const std::string& key : {std::string("grad_reduce_in_fp32 = false"), std::string("exp_avg_dtype = \"bf16\""),
                                 std::string("exp_avg_sq_dtype = \"fp8\"")}) {
    const Scenario s = scenario_from(small_moe("ep = 2", key, 2));
    try {
      run_fake(s, options_for(temp_dir("precision"), 1, 0));
      ADD_FAILURE() << key;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(key.substr(0, key.find(' '))), std::string::npos) << e.what();
    }
  }
}

TEST(Executor, RefusesMultiTokenPredictionDepths) {
  std::string text = small_moe("ep = 2", "", 2);
  const std::size_t model = text.find("[model]\n");
  ASSERT_NE(model, std::string::npos);
  text.insert(model + 8, "mtp_num_layers = 1\n");
  const Scenario s = scenario_from(text);
  try {
    run_fake(s, options_for(temp_dir("mtp"), 1, 0));
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.mtp_num_layers = 1 is simulated only"), std::string::npos) << e.what();
  }
}

TEST(Executor, RefusesAPyTorchProgramsScenario) {
  // run.framework = "pytorch_eager" describes a PyTorch program (its kernels, host costs and gradient
  // copy): the reference runner runs it, not the C++ executor.
  const Scenario s = scenario_from(small_moe("", "", 1, "framework = \"pytorch_eager\"\n"));
  try {
    run_fake(s, options_for(temp_dir("framework"), 1, 0));
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("run.framework"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("threewalls.runner"), std::string::npos) << e.what();
  }
}

TEST(Executor, InferenceStepsRunHostOpsAndVaryPerStep) {
  const fs::path dir = temp_dir("infer");
  const std::string text =
      "schema_version = 1\nname = \"exec_infer\"\n[model]\nnum_layers = 2\nhidden_size = 256\nnum_attention_heads = 4\n"
      "vocab_size = 1024\nnum_experts = 8\nmoe_ffn_hidden_size = 256\nmoe_router_topk = 2\n"
      "[infer]\nbatch_size = 2\nprompt_length = 64\ngenerate_tokens = 2\nsync_routing_stats = true\nsync_after_copy = true\n"
      "[infer.expert_offload]\ntier = \"host_pinned\"\ncache_experts_per_layer = 2\nsync = \"barrier\"\n"
      "[cluster]\ngpu = \"h100\"\ngpus_per_node = 1\nnodes = 1\n[run]\nsteps = 3\nwarmup_steps = 0\n"
      "[run.profiler]\nrecord_every_n_steps = 1\n";
  const Scenario s = scenario_from(text);
  run_fake(s, options_for(dir, 3, 0));
  const profiler::RunData d = profiler::RunDirReader::read(dir);
  std::set<Key> want;
  for (int k = 0; k < 3; ++k) {
    const StepGraph g = scenarios::expand(s, k);
    const auto keys = expected_keys(g, {0}, {k});
    want.insert(keys.begin(), keys.end());
  }
  EXPECT_EQ(want, recorded_keys(d)) << diff(want, recorded_keys(d));
  std::size_t host = 0;
  for (const auto& p : d.phases) host += p.wall == profiler::Wall::host ? 1 : 0;
  EXPECT_GT(host, 0U) << "gpu_read, stream_sync and barrier ops are timed on the host";
  fs::remove_all(dir);
}

// The NVMe tier: expert_fetch_disk reads block the host but use their stream's OpRunner, so the
// executor must open their stream (it did not, and every NVMe scenario failed on the H100 with
// "stream 3 was not created by open()"; the fake device checks the stream as CudaDevice does).
// The summary carries each step's kind, tokens and cache hits from the step's own StepGraph.
TEST(Executor, DiskTierReadsRunOnTheHostThroughTheirOpenedStream) {
  const fs::path dir = temp_dir("nvme");
  for (const char* sync : {"barrier", "per_expert"}) {
    const std::string text =
        "schema_version = 1\nname = \"exec_nvme\"\n[model]\nnum_layers = 2\nhidden_size = 256\nnum_attention_heads = 4\n"
        "vocab_size = 1024\nnum_experts = 8\nmoe_ffn_hidden_size = 256\nmoe_router_topk = 2\n"
        "[infer]\nbatch_size = 2\nprompt_length = 64\ngenerate_tokens = 2\nsync_routing_stats = true\nsync_after_copy = true\n"
        "[infer.expert_offload]\ntier = \"nvme\"\nnvme_path = \"/tmp/tw_exec_nvme_experts.bin\"\n"
        "cache_experts_per_layer = 2\nprefetch = \"next_layer\"\ncopy_streams = 2\nsync = \"" +
        std::string(sync) +
        "\"\n[cluster]\ngpu = \"h100\"\ngpus_per_node = 1\nnodes = 1\n[run]\nsteps = 3\nwarmup_steps = 1\n"
        "[run.profiler]\nrecord_every_n_steps = 1\n";
    const Scenario s = scenario_from(text);
    fs::remove_all(dir);
    const FakeRun run = run_fake(s, options_for(dir, 3, 1));
    const profiler::RunData d = profiler::RunDirReader::read(dir);
    std::set<Key> want;
    double disk_bytes = 0.0;
    std::int64_t hits = 0;
    for (int k = 0; k < 3; ++k) {
      const StepGraph g = scenarios::expand(s, k);
      const auto keys = expected_keys(g, {0}, {k});
      want.insert(keys.begin(), keys.end());
      for (const Op& op : g.class_of(0).ops) {
        if (op.kind == OpKind::copy && op.copy_kind() == scenarios::CopyKind::disk_read) disk_bytes += op.bytes;
      }
      hits += g.class_of(0).experts_cache_hits;
    }
    ASSERT_GT(disk_bytes, 0.0) << "the scenario fetches experts from disk";
    EXPECT_EQ(want, recorded_keys(d)) << sync << "\n" << diff(want, recorded_keys(d));
    std::size_t disk_records = 0;
    for (const auto& p : d.phases) disk_records += d.names.phases.name(p.phase) == "expert_fetch_disk" ? 1 : 0;
    EXPECT_GT(disk_records, 0U);
    ASSERT_FALSE(run.result.summary.inference.empty());
    const auto& all = run.result.summary.inference.front();
    EXPECT_EQ(all.first, "all");
    EXPECT_NEAR(all.second.bytes_fetched_disk_mean * 3.0, disk_bytes, 1e-6 * disk_bytes);
    ASSERT_TRUE(all.second.cache_hit_rate.has_value()) << "cache hits come from the step graphs";
    EXPECT_EQ(hits > 0, *all.second.cache_hit_rate > 0.0);
    ASSERT_EQ(run.result.summary.steps.size(), 3U);
    ASSERT_TRUE(run.result.summary.steps[0].inference.has_value());
    EXPECT_EQ(run.result.summary.steps[0].inference->kind, "prefill");
    EXPECT_EQ(run.result.summary.steps[0].inference->tokens, 2.0 * 64.0);
    EXPECT_EQ(run.result.summary.steps[1].inference->kind, "decode");
    EXPECT_EQ(run.result.summary.steps[1].inference->tokens, 2.0);
  }
  fs::remove_all(dir);
}

TEST(Executor, ExampleScenariosUpToFourGpusRunOnTheFakeDevice) {
  for (const char* name : {"small_moe_1gpu", "small_moe_ep2", "small_moe_ep4", "small_moe_tp2_ep2"}) {
    const fs::path path = fs::path(THREEWALLS_SOURCE_DIR) / "scenarios" / "examples" / (std::string(name) + ".toml");
    const Scenario s = scenarios::load_scenario(path);
    const fs::path dir = temp_dir(name);
    FakeDeviceOptions fo = quick();
    fo.max_op_us = 20.0;  // real shapes: keep the fake step short
    const FakeRun run = run_fake(s, options_for(dir, 1, 0), fo);
    const profiler::RunData d = profiler::RunDirReader::read(dir);
    const StepGraph g = scenarios::expand(s, 0);
    std::vector<int> ranks;
    for (int r = 0; r < s.world_size(); ++r) ranks.push_back(r);
    const auto want = expected_keys(g, ranks, {0});
    EXPECT_EQ(want, recorded_keys(d)) << name << "\n" << diff(want, recorded_keys(d));
    fs::remove_all(dir);
  }
}

// cuda_graph_scope = ["full_iteration"]: the whole step is one captured graph, replayed every step;
// every op is still recorded (the timed capture's pinned markers) and the replay runs on the device.
TEST(Executor, AFullIterationGraphCapturesTheWholeStepAndRecordsEveryOp) {
  for (const char* name : {"switch_d768_t1k_sequential_full_iteration", "switch_d768_t1k_grouped_full_iteration"}) {
    const fs::path path =
        fs::path(THREEWALLS_SOURCE_DIR) / "scenarios" / "validation" / "host_overhead" / (std::string(name) + ".toml");
    const Scenario s = scenarios::load_scenario(path);
    const StepGraph g = scenarios::expand(s, 0);
    ASSERT_EQ(g.class_of(0).graph_runs.size(), 1U) << name;
    const fs::path dir = temp_dir(name);
    FakeDeviceOptions fo = quick();
    fo.max_op_us = 20.0;
    const FakeRun run = run_fake(s, options_for(dir, 2, 1), fo);
    std::size_t in_graph = 0;
    for (const auto& e : run.trace) in_graph += e.in_graph ? 1 : 0;
    // Every device op but the input copy into the step's static buffer (as frameworks keep it
    // outside the graph) runs inside the graph, in every iteration (1 warm-up + 2 steps).
    std::size_t captured = 0;
    for (const Op& op : g.class_of(0).ops) {
      captured += op.kind == OpKind::host || (op.flags & scenarios::kDataLoad) != 0 ? 0 : 1;
    }
    EXPECT_EQ(in_graph, 3U * captured) << name;
    const profiler::RunData d = profiler::RunDirReader::read(dir);
    const auto want = expected_keys(g, {0}, {0, 1});
    EXPECT_EQ(want, recorded_keys(d)) << name << "\n" << diff(want, recorded_keys(d));
    const auto input = d.names.phases.find("host_to_device");
    for (const auto& p : d.phases) {
      if (!input || p.phase != *input) {
        EXPECT_EQ(p.launch_wait_us, 0.0F) << "graph nodes are not launched one by one";
      }
    }
    fs::remove_all(dir);
  }
}

TEST(Executor, AllToAllSplitFollowsTheRoutingModel) {
  Op dispatch;
  dispatch.kind = OpKind::collective;
  dispatch.sub = static_cast<std::uint8_t>(scenarios::Collective::all_to_all);
  dispatch.shape = {4000, 1, 0, 0, 0, 0};
  dispatch.bytes = 4000;
  Op combine = dispatch;
  combine.shape[1] = 2;
  const int n = 4;
  const double f = 2.0;  // EP rank 0 receives twice the mean
  const scenarios::RoutingModel routing(n, f);
  for (int me = 0; me < n; ++me) {
    std::vector<std::size_t> sb, rb;
    all_to_all_split(dispatch, n, me, f, sb, rb);
    for (int j = 0; j < n; ++j) {
      // What I send to j is what j expects from me.
      std::vector<std::size_t> sb_j, rb_j;
      all_to_all_split(dispatch, n, j, f, sb_j, rb_j);
      EXPECT_EQ(sb[static_cast<std::size_t>(j)], rb_j[static_cast<std::size_t>(me)]);
      EXPECT_NEAR(static_cast<double>(sb[static_cast<std::size_t>(j)]), 4000.0 * routing.share(j), 2.0);
      EXPECT_EQ(sb[static_cast<std::size_t>(j)] % 2, 0U) << "whole bf16 elements";
      std::vector<std::size_t> csb, crb, csb_j, crb_j;
      all_to_all_split(combine, n, me, f, csb, crb);
      all_to_all_split(combine, n, j, f, csb_j, crb_j);
      EXPECT_EQ(csb[static_cast<std::size_t>(j)], crb_j[static_cast<std::size_t>(me)]);
    }
  }
  std::vector<std::size_t> sb, rb;
  Op plain = dispatch;
  plain.shape[1] = 0;
  all_to_all_split(plain, n, 1, f, sb, rb);
  for (std::size_t v : sb) EXPECT_EQ(v, 1000U);
}

TEST(Executor, CommunicatorsArePerGroupAndStream) {
  const Scenario s = scenario_from(small_moe("tp = 2\nep = 2\nsequence_parallel = true", "overlap_grad_reduce = true\n", 4));
  const StepGraph g = scenarios::expand(s, 0);
  const auto inst = comm_instances({&g});
  ASSERT_FALSE(inst.empty());
  const auto ids = FakeFabric().make_ids(inst.size());
  for (int r = 0; r < 4; ++r) {
    const auto specs = comm_specs(inst, ids, g, r);
    std::set<std::string> names;
    for (const auto& sp : specs) {
      EXPECT_TRUE(names.insert(sp.name()).second) << "one communicator per (group, stream): " << sp.name();
      EXPECT_EQ(sp.members[static_cast<std::size_t>(sp.index)], r);
      EXPECT_EQ(sp.members, g.layout.group_members(sp.group, r));
    }
    EXPECT_TRUE(names.count("tp@compute")) << r;
    EXPECT_TRUE(names.count("ep@compute")) << r;
    EXPECT_TRUE(names.count("dp_cp@dp_comm") || names.count("dp@dp_comm")) << r;
  }
}

}  // namespace
}  // namespace threewalls::backend
