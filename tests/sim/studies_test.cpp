// The simulator side of the host-overhead and expert-offload studies (docs/validation/host_overhead.md,
// docs/validation/offload.md): every validation scenario simulates with the shipped default profile,
// and the mechanisms the issues describe are in the simulated timelines: per-op launches on the host
// lane, streams:64 concurrency behind event waits, CUDA-graph scopes replacing launches, host syncs
// serialising copies, disk reads feeding the copies, barrier vs per-expert waits, prefetch overlap and
// copy streams. Analytic fidelity in-process (no SimGrid engine); flow fidelity in a child.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "sim_test_support.hpp"
#include "threewalls/core/input_file.hpp"
#include "threewalls/core/jsonl.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/profiler/walls.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/sim/executor.hpp"
#include "threewalls/sim/memory_model.hpp"
#include "threewalls/sim/simulator.hpp"

namespace threewalls::sim {
namespace {

namespace fs = std::filesystem;
using profiler::PhaseRecord;
using profiler::RunData;

fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("threewalls_studies_test_" + std::to_string(getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p.parent_path());
  return p;
}

scenarios::Scenario validation(const std::string& suite, const std::string& name) {
  return scenarios::load_scenario(testing::source_dir() / "scenarios/validation" / suite / (name + ".toml"));
}

// The executor of the host-overhead studies: analytic fidelity (no SimGrid flows).
Executor analytic_executor(const OpCoster& coster) {
  ExecutorOptions eo;
  eo.fidelity = Fidelity::analytic;
  return Executor(coster, eo);
}

// The eager (no CUDA graphs) host-overhead scenarios, sequential experts and 64 expert streams, each
// with its first step's graph.
struct EagerStep {
  std::string strategy;
  scenarios::Scenario s;
  scenarios::StepGraph g;
};
std::vector<EagerStep> eager_host_overhead_steps() {
  std::vector<EagerStep> out;
  for (const std::string strategy : {"sequential", "streams64"}) {
    scenarios::Scenario s = validation("host_overhead", "switch_d768_t1k_" + strategy + "_none");
    scenarios::StepGraph g = scenarios::expand(s, 0);
    out.push_back({strategy, std::move(s), std::move(g)});
  }
  return out;
}

std::vector<fs::path> suite_files(const std::string& suite) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(testing::source_dir() / "scenarios/validation" / suite)) {
    if (e.path().extension() == ".toml") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A variant of an offload scenario: experts run one after another, no host syncs, the given sync
// mode and prefetch. The hash changes so the inference expansion's replay memo keeps them apart.
scenarios::Scenario offload_variant(scenarios::ExpertSync sync, scenarios::Prefetch prefetch, bool sync_after_copy) {
  scenarios::Scenario s = validation("offload", "dsv2lite_host_pinned_barrier_none");
  auto& inf = *s.infer;
  inf.exec.expert_execution.kind = scenarios::ExpertExecutionKind::sequential;
  inf.exec.sync_after_copy = sync_after_copy;
  inf.exec.sync_routing_stats = false;
  inf.expert_offload.sync = sync;
  inf.expert_offload.prefetch = prefetch;
  s.name += "_variant";
  s.content_hash += "-variant-" + std::to_string(static_cast<int>(sync)) + std::to_string(static_cast<int>(prefetch)) +
                    (sync_after_copy ? "s" : "n");
  return s;
}

// Simulates in this process (analytic fidelity: no SimGrid) and reads the run directory back.
RunData simulate_records(const scenarios::Scenario& s, int steps, SimResult* result = nullptr, double disk_scale = 1.0) {
  const fs::path dir = scratch(s.name);
  SimOptions o;
  o.fidelity = Fidelity::analytic;
  o.steps = steps;
  o.disk_scale = disk_scale;
  o.out_dir = dir;
  o.overwrite = true;
  const SimResult r = simulate(s, "auto", o);
  if (result != nullptr) *result = r;
  RunData d = profiler::RunDirReader::read(dir);
  fs::remove_all(dir);
  return d;
}

std::vector<const PhaseRecord*> records_of(const RunData& d, const std::string& phase, int step) {
  std::vector<const PhaseRecord*> out;
  const auto id = d.names.phases.find(phase);
  if (!id) return out;
  for (const auto& p : d.phases) {
    if (p.phase == *id && p.step == step) out.push_back(&p);
  }
  return out;
}

double end_of(const PhaseRecord* p) { return p->start_us + p->dur_us; }

bool overlap(const PhaseRecord* a, const PhaseRecord* b) {
  return a->start_us < end_of(b) - 1e-6 && b->start_us < end_of(a) - 1e-6;
}

constexpr double kEps = 1e-2;  // us: start and duration are each written rounded to the nanosecond

// ------------------------------------------------------------------ every scenario simulates

TEST(ValidationSuites, EveryHostOverheadAndOffloadScenarioSimulatesWithTheShippedProfile) {
  std::size_t n = 0;
  for (const char* suite : {"host_overhead", "offload"}) {
    for (const fs::path& f : suite_files(suite)) {
      const scenarios::Scenario s = scenarios::load_scenario(f);
      SimOptions o;
      o.fidelity = Fidelity::analytic;
      o.steps = 2;
      const SimResult r = simulate(s, "auto", o);
      ASSERT_EQ(r.summary.steps.size(), 2U) << f;
      EXPECT_GT(r.summary.steps[0].step_time_us, 0.0) << f;
      EXPECT_TRUE(r.summary.steps[0].walls.has_value()) << f;
      // Inference runs: the metrics are in the summary.
      EXPECT_TRUE(r.summary.steps[1].inference.has_value()) << f;
      EXPECT_TRUE(r.summary_json.contains("inference")) << f;
      ++n;
    }
  }
  EXPECT_EQ(n, 40U + 8U);  // 36 + 4 full_iteration host-overhead scenarios, 8 offload
}

TEST(ValidationSuites, OneScenarioOfEachSuiteSimulatesInFlowFidelity) {
  for (const auto& [suite, name] : std::vector<std::pair<std::string, std::string>>{
           {"host_overhead", "switch_d768_t1k_streams64_attn_router"}, {"offload", "dsv2lite_nvme_per_expert_next_layer"}}) {
    const scenarios::Scenario s = validation(suite, name);
    const std::string out = testing::in_child([&]() {
      SimOptions o;
      o.steps = 2;
      const SimResult r = simulate(s, "auto", o);
      return std::string("ok ") + std::to_string(r.summary.step_time_us.median);
    });
    EXPECT_EQ(out.rfind("ok", 0), 0U) << name << ": " << out;
  }
}

// ------------------------------------------------------------------ host overhead

TEST(HostOverheadStudy, Streams64RunsTheExpertsConcurrentlyBehindTheirEventWaits) {
  const RunData d = simulate_records(validation("host_overhead", "switch_d768_t4k_streams64_none"), 1);
  const auto fc1 = records_of(d, "expert_fc1_fwd", 0);
  ASSERT_EQ(fc1.size(), 64U);
  std::set<std::uint32_t> streams;
  for (const PhaseRecord* p : fc1) streams.insert(p->stream);
  EXPECT_EQ(streams.size(), 64U);
  // Kernels of several streams run at the same time.
  std::size_t concurrent = 0;
  for (std::size_t i = 0; i < fc1.size(); ++i) {
    for (std::size_t j = i + 1; j < fc1.size(); ++j) concurrent += overlap(fc1[i], fc1[j]) ? 1 : 0;
  }
  EXPECT_GT(concurrent, 0U);
  // Every expert waits for the router (an event on the compute stream); the output waits for all.
  const auto topk = records_of(d, "router_topk_fwd", 0);
  ASSERT_EQ(topk.size(), 1U);
  for (const char* ph : {"expert_gather_fwd", "expert_fc1_fwd", "expert_fc2_fwd", "expert_scatter_fwd"}) {
    for (const PhaseRecord* p : records_of(d, ph, 0)) EXPECT_GE(p->start_us, end_of(topk[0]) - kEps) << ph;
  }
  const auto bda = records_of(d, "mlp_bda_fwd", 0);
  ASSERT_EQ(bda.size(), 1U);
  for (const PhaseRecord* p : records_of(d, "expert_scatter_fwd", 0)) EXPECT_LE(end_of(p), bda[0]->start_us + kEps);
}

// Closed-form costs for the host-lane checks: every kernel and copy takes `op_us`, communication is
// free, the host costs are `host`; with `ideal`, k concurrent kernels run at full speed each.
class FixedCoster final : public OpCoster {
 public:
  FixedCoster(double op_us, HostCosts host, bool ideal = false) : op_(microseconds(op_us)), host_(host), ideal_(ideal) {}
  [[nodiscard]] Seconds kernel_time(const scenarios::Op&) const override { return op_; }
  [[nodiscard]] Seconds copy_time(scenarios::CopyKind, Bytes) const override { return op_; }
  [[nodiscard]] CommParams comm_params(Collective, Bytes, int, LinkScope) const override {
    return {Seconds(0.0), BytesPerSecond(1e15)};
  }
  [[nodiscard]] HostCosts host_costs() const override { return host_; }
  [[nodiscard]] double stream_concurrency(int streams, double) const override { return ideal_ ? streams : 1.0; }
  [[nodiscard]] int sm_count() const override { return 132; }
  [[nodiscard]] std::optional<Seconds> framework_body_host(const scenarios::Op& op,
                                                           bool records_autograd) const override {
    return body_ ? body_(op, records_autograd) : std::nullopt;
  }
  // PyTorch's host time per op body (empty: none, the per-launch costs).
  std::function<std::optional<Seconds>(const scenarios::Op&, bool)> body_;

 private:
  Seconds op_;
  HostCosts host_;
  bool ideal_;
};

HostCosts host_costs(double launch_us, double event_us = 0.0) {
  HostCosts h{};
  h.kernel_launch = microseconds(launch_us);
  h.event_record = microseconds(event_us);
  return h;
}

// Every kernel and copy 0.1 us, launches 10 us, nothing else costs anything: a step is launch-bound
// and its time is the host's.
FixedCoster launch_bound_coster() {
  HostCosts h = host_costs(10);
  h.collective_launch = microseconds(10);
  h.graph_launch = microseconds(10);
  return FixedCoster(0.1, h);
}

// 64 expert streams share CUDA's 8 hardware work queues (docs/simulator.md, "Hardware work
// queues"). With free launches, 5 us kernels and an ideal GPU (k kernels at full speed each), all 64
// expert chains are ready when the router ends; with 8 queues dispatching in issue order at most two
// ops per queue run at once (a chain's last op and the next chain's first), without queues dozens do.
TEST(HostOverheadStudy, Streams64ExpertChainsShareEightHardwareQueues) {
  const FixedCoster coster(5, HostCosts{}, true);
  const scenarios::Scenario sc = validation("host_overhead", "switch_d768_t1k_streams64_none");
  const scenarios::StepGraph g = scenarios::expand(sc, 0);
  const Platform p(sc.cluster);
  auto most_at_once = [&](int queues) {
    ExecutorOptions eo;
    eo.fidelity = Fidelity::analytic;
    eo.hardware_queues = queues;
    const StepResult r = Executor(coster, eo).run_step(g, p, {}, 0.0, nullptr);
    std::vector<std::pair<double, int>> ev;
    const auto& rc = g.classes[0];
    for (std::size_t i = 0; i < rc.ops.size(); ++i) {
      if (rc.ops[i].kind == scenarios::OpKind::host) continue;
      ev.emplace_back(r.classes[0].start[i], 1);
      ev.emplace_back(r.classes[0].end[i], -1);
    }
    std::sort(ev.begin(), ev.end());  // an end before a start at the same instant
    int now = 0, most = 0;
    for (const auto& [t, d] : ev) most = std::max(most, now += d);
    return most;
  };
  EXPECT_LE(most_at_once(8), 16);
  EXPECT_GE(most_at_once(0), 32);
}

TEST(HostOverheadStudy, GraphScopesReplaceTheirOpsLaunchesWithOneGraphLaunch) {
  // For each strategy: the attn + moe_router graphs save one launch per captured op but the first of
  // each run; in a launch-bound step that is exactly the step time saved, all of it host wall.
  const FixedCoster coster = launch_bound_coster();
  const Executor exec = analytic_executor(coster);
  for (const char* strategy : {"sequential", "streams64", "grouped"}) {
    const std::string base = std::string("switch_d768_t1k_") + strategy;
    const scenarios::Scenario eager = validation("host_overhead", base + "_none");
    const scenarios::Scenario graphs = validation("host_overhead", base + "_attn_router");
    const scenarios::StepGraph ge = scenarios::expand(eager, 0);
    const scenarios::StepGraph gg = scenarios::expand(graphs, 0);
    ASSERT_EQ(ge.classes[0].ops.size(), gg.classes[0].ops.size()) << strategy;
    ASSERT_TRUE(ge.classes[0].graph_runs.empty()) << strategy;
    ASSERT_FALSE(gg.classes[0].graph_runs.empty()) << strategy;
    std::size_t captured = 0;
    for (const auto& run : gg.classes[0].graph_runs) captured += run.end_op - run.first_op;
    const std::size_t runs = gg.classes[0].graph_runs.size();
    const Platform p(eager.cluster);
    const StepResult re = exec.run_step(ge, p, {}, 0.0, nullptr);
    const StepResult rg = exec.run_step(gg, p, {}, 0.0, nullptr);
    EXPECT_NEAR((re.duration - rg.duration) * 1e6, 10.0 * static_cast<double>(captured - runs), 0.5) << strategy;
    // The host wall shows it.
    auto host_wall = [](const scenarios::StepGraph& g, const StepResult& r) {
      std::vector<profiler::TimelineOp> tl;
      const auto& rc = g.classes[0];
      for (std::size_t i = 0; i < rc.ops.size(); ++i) {
        tl.push_back({r.classes[0].start[i] * 1e6, r.classes[0].end[i] * 1e6,
                      static_cast<profiler::Wall>(static_cast<int>(rc.ops[i].wall)), false});
      }
      return profiler::sweep_walls(tl, r.duration * 1e6);
    };
    const auto we = host_wall(ge, re);
    const auto wg = host_wall(gg, rg);
    EXPECT_GT(we.host_us / (re.duration * 1e6), 0.9) << strategy << ": launch-bound";
    EXPECT_NEAR(we.host_us - wg.host_us, (re.duration - rg.duration) * 1e6, 1.0) << strategy;
  }
}

TEST(HostOverheadStudy, EveryEagerOpCostsOneLaunchAndStreamsAddTheirEventsOnTheHostLane) {
  // Launch-bound and with 2 us events, a step costs: the fence (one event per stream), a launch per
  // op, an event wait per cross-stream dependency, an event behind every op waited for across
  // streams, the join (two events per stream but one). Count them on the expansion.
  const FixedCoster coster(0.1, host_costs(10, 2));
  const Executor exec = analytic_executor(coster);
  for (const auto& [strategy, s, g] : eager_host_overhead_steps()) {
    const auto& rc = g.classes[0];
    std::size_t launches = 0, waits = 0, events = 0, reads = 0;
    std::set<std::uint8_t> streams;
    std::vector<bool> waited(rc.ops.size(), false);
    for (std::size_t i = 0; i < rc.ops.size(); ++i) {
      const auto& op = rc.ops[i];
      if (op.kind == scenarios::OpKind::host) {
        for (std::size_t d = 0; d < rc.num_deps(op); ++d) waited[rc.deps_of(op)[d]] = true;
        reads += op.host_kind() == scenarios::HostKind::gpu_read ? 1 : 0;  // + the event it waits on
        continue;
      }
      ++launches;
      streams.insert(op.stream);
      for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
        const auto dep = rc.deps_of(op)[d];
        if (rc.ops[dep].stream != op.stream) {
          ++waits;
          waited[dep] = true;
        }
      }
    }
    for (bool w : waited) events += w ? 1 : 0;
    const double expected_us = 10.0 * static_cast<double>(launches) +
                               2.0 * static_cast<double>(waits + events + reads + streams.size() + 2 * (streams.size() - 1));
    const StepResult r = exec.run_step(g, Platform(s.cluster), {}, 0.0, nullptr);
    EXPECT_NEAR(r.duration * 1e6, expected_us, 1.0) << strategy;
    if (strategy == "streams64") {
      EXPECT_EQ(streams.size(), 64U + 1U);  // compute, expert_1..63 and the input's copy stream
      EXPECT_GE(waits, 2U * 63U);           // into each expert stream and back
    }
  }
}

TEST(HostOverheadStudy, PyTorchEagerPaysTheFrameworkOpOnEveryLaunchOutsideAGraphRun) {
  // Launch-bound, run.framework = "pytorch_eager" adds host.framework_op (here 5 us) to every eager
  // launch and to none of the ops of a CUDA-graph run; "cpp" adds nothing.
  HostCosts h = host_costs(10);
  h.collective_launch = microseconds(10);
  h.graph_launch = microseconds(10);
  h.framework_op = microseconds(5);
  const FixedCoster coster(0.1, h);
  ExecutorOptions cpp;
  cpp.fidelity = Fidelity::analytic;
  ExecutorOptions torch = cpp;
  torch.framework = scenarios::Framework::pytorch_eager;
  const Executor ec(coster, cpp);
  const Executor et(coster, torch);
  std::map<std::string, std::size_t> eager_of;
  for (const std::string graphs : {"none", "attn_router"}) {
    const scenarios::Scenario s = validation("host_overhead", "switch_d768_t1k_sequential_" + graphs);
    const scenarios::StepGraph g = scenarios::expand(s, 0);
    const auto& rc = g.classes[0];
    std::vector<bool> in_run(rc.ops.size(), false);
    for (const auto& run : rc.graph_runs) {
      for (auto i = run.first_op; i < run.end_op; ++i) in_run[i] = true;
    }
    std::size_t eager = 0;
    for (std::size_t i = 0; i < rc.ops.size(); ++i) {
      eager += rc.ops[i].kind != scenarios::OpKind::host && !in_run[i] ? 1 : 0;
    }
    const Platform p(s.cluster);
    const StepResult rcpp = ec.run_step(g, p, {}, 0.0, nullptr);
    const StepResult rtorch = et.run_step(g, p, {}, 0.0, nullptr);
    EXPECT_NEAR((rtorch.duration - rcpp.duration) * 1e6, 5.0 * static_cast<double>(eager), 0.5) << graphs;
    eager_of[graphs] = eager;
  }
  EXPECT_LT(eager_of["attn_router"], eager_of["none"]);  // the graph runs' ops pay no framework op
}

TEST(HostOverheadStudy, PyTorchEagerBackwardLaunchesPayTheAutogradNodeInsteadOfTheForwardDispatch) {
  // The reference runner's OLMoE-like eager scenario (training): with host.framework_backward_op (2 us)
  // every backward launch pays it instead of host.framework_op (5 us); without it, framework_op.
  const scenarios::Scenario s =
      scenarios::load_scenario(testing::source_dir() / "python/scenarios/olmoe_4l_eager.toml");
  ASSERT_EQ(s.run.framework, scenarios::Framework::pytorch_eager);
  const scenarios::StepGraph g = scenarios::expand(s, 0);
  const auto& rc = g.classes[0];
  std::size_t fwd = 0;
  std::size_t bwd = 0;
  for (const auto& op : rc.ops) {
    if (op.kind == scenarios::OpKind::host) continue;
    ((op.flags & scenarios::kBackward) != 0 ? bwd : fwd) += 1;
  }
  ASSERT_TRUE(rc.graph_runs.empty());
  ASSERT_GT(bwd, 1000U);
  ASSERT_GT(fwd, 1000U);
  HostCosts h = launch_bound_coster().host_costs();
  h.framework_op = microseconds(5);
  ExecutorOptions cpp;
  cpp.fidelity = Fidelity::analytic;
  ExecutorOptions torch = cpp;
  torch.framework = scenarios::Framework::pytorch_eager;
  const Platform p(s.cluster);
  const FixedCoster without(0.1, h);
  const double base = Executor(without, cpp).run_step(g, p, {}, 0.0, nullptr).duration;
  const double fw_op = Executor(without, torch).run_step(g, p, {}, 0.0, nullptr).duration;
  EXPECT_NEAR((fw_op - base) * 1e6, 5.0 * static_cast<double>(fwd + bwd), 1.0);
  h.framework_backward_op = microseconds(2);
  const FixedCoster with(0.1, h);
  const double fw_bwd = Executor(with, torch).run_step(g, p, {}, 0.0, nullptr).duration;
  EXPECT_NEAR((fw_bwd - base) * 1e6, 5.0 * static_cast<double>(fwd) + 2.0 * static_cast<double>(bwd), 1.0);
  EXPECT_NEAR(Executor(with, cpp).run_step(g, p, {}, 0.0, nullptr).duration, base, 1e-9);  // cpp: neither
}

TEST(HostOverheadStudy, PyTorchEagerOpsWithAMeasuredBodyPayItsHostTimeInPlaceOfTheirLaunches) {
  // A training step of the eager OLMoE-like scenario on a launch-bound GPU: forward GEMMs whose body
  // (F.linear) costs 40 us of host pay that instead of their launch plus host.framework_op; the
  // other ops keep the per-launch costs; the C++ executor never asks.
  const scenarios::Scenario s =
      scenarios::load_scenario(testing::source_dir() / "python/scenarios/olmoe_4l_eager.toml");
  const scenarios::StepGraph g = scenarios::expand(s, 0);
  std::size_t fwd_gemms = 0;
  for (const auto& op : g.classes[0].ops) {
    if (op.kind == scenarios::OpKind::gemm && (op.flags & scenarios::kBackward) == 0) ++fwd_gemms;
  }
  ASSERT_GT(fwd_gemms, 100U);
  HostCosts h = launch_bound_coster().host_costs();
  h.framework_op = microseconds(5);
  ExecutorOptions torch;
  torch.fidelity = Fidelity::analytic;
  torch.framework = scenarios::Framework::pytorch_eager;
  const Platform p(s.cluster);
  const FixedCoster per_launch(0.1, h);
  FixedCoster bodies(0.1, h);
  std::size_t asked_without_autograd = 0;
  bodies.body_ = [&](const scenarios::Op& op, bool records_autograd) -> std::optional<Seconds> {
    if (!records_autograd) ++asked_without_autograd;
    if (op.kind != scenarios::OpKind::gemm || (op.flags & scenarios::kBackward) != 0) return std::nullopt;
    return microseconds(40);
  };
  const double base = Executor(per_launch, torch).run_step(g, p, {}, 0.0, nullptr).duration;
  const double with = Executor(bodies, torch).run_step(g, p, {}, 0.0, nullptr).duration;
  EXPECT_EQ(asked_without_autograd, 0U);  // a training step's forward records autograd nodes
  const double launch = h.gemm_launch ? h.gemm_launch->value : h.kernel_launch.value;
  EXPECT_NEAR((with - base) * 1e6, (40.0 - (launch * 1e6 + 5.0)) * static_cast<double>(fwd_gemms), 1.0);
  ExecutorOptions cpp = torch;
  cpp.framework = scenarios::Framework::cpp;
  EXPECT_NEAR(Executor(bodies, cpp).run_step(g, p, {}, 0.0, nullptr).duration,
              Executor(per_launch, cpp).run_step(g, p, {}, 0.0, nullptr).duration, 1e-9);
}

TEST(HostOverheadStudy, APyTorchEagerExpertLoopReadsEachExpertsRowsWaitingForItsStream) {
  // Hugging Face's eager loop (run.framework = "pytorch_eager", sequential experts, one EP rank):
  // torch.where of each expert's mask, a device-to-host read (expert_rows_read) behind the previous
  // expert's scatter on its stream, before the expert's gather. The C++ executor's loop has none.
  scenarios::Scenario s = scenarios::load_scenario(testing::source_dir() / "python/scenarios/olmoe_4l_eager.toml");
  const scenarios::StepGraph g = scenarios::expand(s, 0);
  const auto& rc = g.classes[0];
  std::size_t reads = 0;
  for (std::size_t i = 0; i < rc.ops.size(); ++i) {
    const auto& op = rc.ops[i];
    if (g.phase_name(op) != "expert_rows_read_fwd") continue;
    ++reads;
    ASSERT_EQ(op.kind, scenarios::OpKind::host);
    EXPECT_EQ(op.host_kind(), scenarios::HostKind::gpu_read);
    ASSERT_EQ(op.deps_end - op.deps_begin, 1U);
    const auto& dep = rc.ops[rc.deps[op.deps_begin]];
    EXPECT_EQ(g.phase_name(dep), op.expert == 0 ? "router_topk_fwd" : "expert_scatter_fwd") << op.expert;
    if (op.expert > 0) {
      EXPECT_EQ(dep.expert, op.expert - 1);
    }
    ASSERT_LT(i + 1, rc.ops.size());
    EXPECT_EQ(g.phase_name(rc.ops[i + 1]), "expert_gather_fwd");
    EXPECT_EQ(rc.ops[i + 1].expert, op.expert);
  }
  EXPECT_EQ(reads, 64U * 4U * 2U);  // experts x layers x micro-batches
  scenarios::Scenario cpp_s = s;
  cpp_s.run.framework = scenarios::Framework::cpp;
  const scenarios::StepGraph cg = scenarios::expand(cpp_s, 0);
  EXPECT_EQ(cg.classes[0].ops.size() + reads + 1, rc.ops.size());  // + the program's main_grad_copy
  s.train->exec.expert_execution = {scenarios::ExpertExecutionKind::grouped, 1};
  const scenarios::StepGraph gg = scenarios::expand(s, 0);
  for (const auto& op : gg.classes[0].ops) EXPECT_NE(gg.phase_name(op), "expert_rows_read_fwd");  // grouped: none
  // Each read costs host.framework_sync (30 us) in place of host.gpu_read (and its event); the
  // device is idle-fast, so the step grows by the reads' host time.
  HostCosts h = launch_bound_coster().host_costs();
  h.gpu_read = microseconds(4);
  h.event_record = microseconds(1);
  ExecutorOptions torch;
  torch.fidelity = Fidelity::analytic;
  torch.framework = scenarios::Framework::pytorch_eager;
  const Platform p(s.cluster);
  const double plain = Executor(FixedCoster(0.1, h), torch).run_step(g, p, {}, 0.0, nullptr).duration;
  h.framework_sync = microseconds(30);
  const double synced = Executor(FixedCoster(0.1, h), torch).run_step(g, p, {}, 0.0, nullptr).duration;
  std::size_t all_reads = 0;  // the experts' and the step's other reads (the loss)
  for (const auto& op : rc.ops) {
    all_reads += op.kind == scenarios::OpKind::host && op.host_kind() == scenarios::HostKind::gpu_read ? 1 : 0;
  }
  EXPECT_NEAR((synced - plain) * 1e6, (30.0 - 5.0) * static_cast<double>(all_reads),
              0.2 * static_cast<double>(all_reads));
}

TEST(HostOverheadStudy, ATimedOpsRecordRunsFromItsStartMarkerToItsEndMarkerAsThreewallsRunMeasuresIt) {
  // threewalls run records an event on the op's stream just before the launch and one just after
  // (backend/src/executor.cpp, issue_op): on an idle, launch-bound stream the record includes the
  // launch (10 us here) and ends no earlier than the end marker's record (one event, 2 us, later).
  const FixedCoster coster(0.1, host_costs(10, 2));
  const Executor exec = analytic_executor(coster);
  for (const auto& [strategy, s, g] : eager_host_overhead_steps()) {
    const auto& rc = g.classes[0];
    const std::vector<Timing> timing{Timing::every_op};
    const StepResult r = exec.run_step(g, Platform(s.cluster), {}, 0.0, nullptr, timing);
    const ClassTimeline& t = r.classes[0];
    ASSERT_EQ(t.record_start.size(), rc.ops.size());
    std::size_t experts = 0;
    for (std::size_t i = 0; i < rc.ops.size(); ++i) {
      const auto& op = rc.ops[i];
      if (op.expert < 0 || op.kind == scenarios::OpKind::host) continue;
      ++experts;
      EXPECT_NEAR((t.start[i] - t.record_start[i]) * 1e6, 10.0, 1e-6) << strategy << " op " << i;
      EXPECT_NEAR((t.record_end[i] - t.start[i]) * 1e6, 2.0, 1e-6) << strategy << " op " << i;
      EXPECT_GE(t.end[i], t.start[i]);
      // The device waited for the launch inside the record: launch_wait_us, which the wall sweep
      // counts as host (threewalls run measures it as launch return minus record start).
      ASSERT_EQ(t.launch_wait.size(), rc.ops.size());
      EXPECT_NEAR(t.launch_wait[i] * 1e6, 10.0, 1e-6) << strategy << " op " << i;
    }
    EXPECT_EQ(experts, 5U * 64U) << strategy;
    std::vector<profiler::TimelineOp> tl;
    for (std::size_t i = 0; i < rc.ops.size(); ++i) {
      const auto w = static_cast<profiler::Wall>(static_cast<int>(rc.ops[i].wall));
      profiler::TimelineOp o{t.record_start[i] * 1e6, t.record_end[i] * 1e6, w, false};
      if (w != profiler::Wall::communication) o.launch_wait_us = t.launch_wait[i] * 1e6;
      tl.push_back(o);
    }
    const profiler::WallBreakdown walls = profiler::sweep_walls(tl, r.duration * 1e6);
    EXPECT_GT(walls.host_us / (r.duration * 1e6), 0.8) << strategy << ": launch-bound, and the walls say so";
    // Untimed: records are the device execution itself (no record times of their own: start / end),
    // without launch waits.
    const StepResult u = exec.run_step(g, Platform(s.cluster), {}, 0.0, nullptr, {});
    EXPECT_TRUE(u.classes[0].record_start.empty());
    EXPECT_TRUE(u.classes[0].record_end.empty());
    EXPECT_TRUE(u.classes[0].launch_wait.empty()) << "untimed ops carry no launch wait";
  }
}

TEST(HostOverheadStudy, ATimedGraphReplayCarriesAMarkerNodeBeforeAndAfterEveryRecordedOp) {
  // threewalls run replays a timed capture on recorded steps: a timing-marker node around every op
  // (backend executor.cpp capture_once). With 5 us kernels, 1 us per graph node and 2 us per marker,
  // a recorded full_iteration step of the device-bound graph is 4 us per captured op longer than an
  // unrecorded one, and each record is kernel + node + one marker, the next op's start marker the gap.
  HostCosts h = host_costs(0.01);
  h.graph_launch = microseconds(0.01);
  h.graph_node = microseconds(1);
  h.timing_marker = microseconds(2);
  const FixedCoster coster(5, h);
  const Executor exec = analytic_executor(coster);
  const scenarios::Scenario s = validation("host_overhead", "switch_d768_t1k_sequential_full_iteration");
  const scenarios::StepGraph g = scenarios::expand(s, 0);
  const auto& rc = g.classes[0];
  ASSERT_EQ(rc.graph_runs.size(), 1U);
  const auto& run = rc.graph_runs[0];
  std::size_t captured = 0, eager = 0;  // eager: the input copy, outside the graph (its two markers too)
  for (std::uint32_t i = 0; i < rc.ops.size(); ++i) {
    if (rc.ops[i].kind == scenarios::OpKind::host) continue;
    (i >= run.first_op && i < run.end_op ? captured : eager) += 1;
  }
  ASSERT_EQ(eager, 1U);
  const std::vector<Timing> every{Timing::every_op};
  const StepResult timed = exec.run_step(g, Platform(s.cluster), {}, 0.0, nullptr, every);
  const StepResult plain = exec.run_step(g, Platform(s.cluster), {}, 0.0, nullptr, {});
  EXPECT_NEAR((timed.duration - plain.duration) * 1e6, 4.0 * static_cast<double>(captured + eager), 1e-3);
  const ClassTimeline& t = timed.classes[0];
  std::size_t checked = 0;
  for (std::uint32_t i = run.first_op; i < run.end_op; ++i) {
    if (rc.ops[i].kind == scenarios::OpKind::host) continue;
    EXPECT_NEAR((t.record_end[i] - t.record_start[i]) * 1e6, 5.0 + 1.0 + 2.0, 1e-6) << i;
    EXPECT_NEAR((t.record_start[i] - t.start[i]) * 1e6, 2.0, 1e-6) << i;
    EXPECT_EQ(t.launch_wait[i], 0.0) << "graph nodes are not launched one by one";
    ++checked;
  }
  EXPECT_EQ(checked, captured);
}

TEST(HostOverheadStudy, EveryFurtherStreamAddsItsOpRunnersWorkspaceAndBuffersToMemory) {
  // threewalls run gives each stream an OpRunner with its own cuBLASLt workspace and buffers.
  const scenarios::Scenario seq = validation("host_overhead", "switch_d768_t1k_sequential_none");
  const scenarios::Scenario s64 = validation("host_overhead", "switch_d768_t1k_streams64_none");
  const MemoryReport a = memory_model(seq, scenarios::expand(seq, 0));
  const MemoryReport b = memory_model(s64, scenarios::expand(s64, 0));
  const double extra = b.classes[0].breakdown.buffers.value - a.classes[0].breakdown.buffers.value;
  EXPECT_GE(extra, 63.0 * kOpRunnerWorkspaceBytes);  // 63 expert streams beyond the compute stream
  EXPECT_LE(extra, 63.0 * (kOpRunnerWorkspaceBytes + 16.0 * 1024 * 1024));
}

// ------------------------------------------------------------------ expert offloading

TEST(OffloadStudy, AStreamSyncAfterEveryCopySerialisesTheFetchesOnTheHost) {
  scenarios::Scenario s = validation("offload", "dsv2lite_host_pinned_barrier_none");
  ASSERT_TRUE(s.infer->exec.sync_after_copy);
  ASSERT_EQ(s.infer->expert_offload.copy_streams, 2);
  const RunData d = simulate_records(s, 2);
  for (int step : {0, 1}) {
    auto h2d = records_of(d, "expert_fetch_h2d", step);
    ASSERT_GT(h2d.size(), 10U);
    std::sort(h2d.begin(), h2d.end(), [](auto* a, auto* b) { return a->start_us < b->start_us; });
    for (std::size_t i = 1; i < h2d.size(); ++i) EXPECT_FALSE(overlap(h2d[i - 1], h2d[i])) << "step " << step;
    // Each sync follows its copy.
    std::map<std::pair<int, int>, const PhaseRecord*> copy_of;
    for (const PhaseRecord* p : h2d) copy_of[{p->layer, p->expert}] = p;
    for (const PhaseRecord* sy : records_of(d, "expert_fetch_sync", step)) {
      const PhaseRecord* cp = copy_of.at({sy->layer, sy->expert});
      EXPECT_GE(sy->start_us, end_of(cp) - kEps);
    }
  }
}

TEST(OffloadStudy, WithoutHostSyncsTheTwoCopyStreamsCarryFetchesAtOnce) {
  const RunData d = simulate_records(
      offload_variant(scenarios::ExpertSync::barrier, scenarios::Prefetch::none, /*sync_after_copy=*/false), 2);
  const auto h2d = records_of(d, "expert_fetch_h2d", 1);
  std::set<std::uint32_t> streams;
  std::size_t concurrent = 0;
  for (std::size_t i = 0; i < h2d.size(); ++i) {
    streams.insert(h2d[i]->stream);
    for (std::size_t j = i + 1; j < h2d.size(); ++j) concurrent += overlap(h2d[i], h2d[j]) ? 1 : 0;
  }
  EXPECT_EQ(streams.size(), 2U);
  EXPECT_GT(concurrent, 0U);
}

TEST(OffloadStudy, DiskReadsRunOneAtATimeOnTheHostAndFeedTheirCopies) {
  const RunData d = simulate_records(validation("offload", "dsv2lite_nvme_barrier_none"), 2);
  auto disk = records_of(d, "expert_fetch_disk", 1);
  const auto h2d = records_of(d, "expert_fetch_h2d", 1);
  ASSERT_EQ(disk.size(), h2d.size());
  std::sort(disk.begin(), disk.end(), [](auto* a, auto* b) { return a->start_us < b->start_us; });
  for (std::size_t i = 1; i < disk.size(); ++i) EXPECT_FALSE(overlap(disk[i - 1], disk[i]));
  std::map<std::pair<int, int>, const PhaseRecord*> read_of;
  for (const PhaseRecord* p : disk) read_of[{p->layer, p->expert}] = p;
  for (const PhaseRecord* p : h2d) EXPECT_GE(p->start_us, end_of(read_of.at({p->layer, p->expert})) - kEps);
}

// threewalls sim --disk-scale: every disk read takes the factor longer, and a decode step
// that waits on the disk grows with it, while the host tier's step does not move.
TEST(OffloadStudy, DiskScaleStretchesDiskReadsAndTheDiskBoundStep) {
  SimResult base_r, slow_r;
  const RunData base = simulate_records(validation("offload", "dsv2lite_nvme_barrier_none"), 2, &base_r);
  const RunData slow = simulate_records(validation("offload", "dsv2lite_nvme_barrier_none"), 2, &slow_r, 1.3);
  const auto a = records_of(base, "expert_fetch_disk", 1);
  const auto b = records_of(slow, "expert_fetch_disk", 1);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  double sum_a = 0.0, sum_b = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    sum_a += a[i]->dur_us;
    sum_b += b[i]->dur_us;
  }
  EXPECT_NEAR(sum_b, 1.3 * sum_a, 1e-6 * sum_b);
  const double step_a = base_r.summary.steps[1].step_time_us, step_b = slow_r.summary.steps[1].step_time_us;
  EXPECT_GT(step_b, step_a + 0.9 * (sum_b - sum_a));  // the reads are the step's critical path
  EXPECT_LT(step_b, 1.3 * step_a);
  EXPECT_EQ(slow.header.settings.at("simulator").at("disk_scale").get<double>(), 1.3);
  SimResult host_a, host_b;
  simulate_records(validation("offload", "dsv2lite_host_pinned_per_expert_next_layer"), 2, &host_a);
  simulate_records(validation("offload", "dsv2lite_host_pinned_per_expert_next_layer"), 2, &host_b, 1.3);
  EXPECT_DOUBLE_EQ(host_b.summary.steps[1].step_time_us, host_a.summary.steps[1].step_time_us);
}

// Expert GEMMs that need fetched weights, by (layer, local expert).
std::map<std::pair<int, int>, const PhaseRecord*> first_gemm(const RunData& d, int step) {
  std::map<std::pair<int, int>, const PhaseRecord*> out;
  for (const char* ph : {"expert_gate_fwd", "expert_fc1_fwd"}) {
    for (const PhaseRecord* p : records_of(d, ph, step)) {
      auto [it, fresh] = out.emplace(std::make_pair(p->layer, p->expert), p);
      if (!fresh && p->start_us < it->second->start_us) it->second = p;
    }
  }
  return out;
}

std::map<int, double> last_fetch_end(const RunData& d, int step) {
  std::map<int, double> out;
  for (const PhaseRecord* p : records_of(d, "expert_fetch_h2d", step)) out[p->layer] = std::max(out[p->layer], end_of(p));
  return out;
}

TEST(OffloadStudy, TheBarrierHoldsALayersExpertsUntilAllItsFetchesArrive) {
  const RunData d = simulate_records(
      offload_variant(scenarios::ExpertSync::barrier, scenarios::Prefetch::none, false), 2);
  const auto last = last_fetch_end(d, 1);
  ASSERT_FALSE(last.empty());
  for (const char* ph : {"expert_gather_fwd", "expert_gate_fwd", "expert_fc1_fwd"}) {
    for (const PhaseRecord* p : records_of(d, ph, 1)) {
      auto it = last.find(p->layer);
      if (it != last.end()) {
        EXPECT_GE(p->start_us, it->second - kEps) << ph << " layer " << p->layer;
      }
    }
  }
}

TEST(OffloadStudy, PerExpertWaitsLetAnExpertComputeWhileTheNextIsCopied) {
  const RunData d = simulate_records(
      offload_variant(scenarios::ExpertSync::per_expert, scenarios::Prefetch::none, false), 2);
  const auto last = last_fetch_end(d, 1);
  const auto gemms = first_gemm(d, 1);
  std::map<std::pair<int, int>, const PhaseRecord*> fetch;
  for (const PhaseRecord* p : records_of(d, "expert_fetch_h2d", 1)) fetch[{p->layer, p->expert}] = p;
  std::size_t early = 0;
  for (const auto& [key, g] : gemms) {
    auto f = fetch.find(key);
    if (f != fetch.end()) {
      EXPECT_GE(g->start_us, end_of(f->second) - kEps);  // its own weights first
    }
    auto l = last.find(key.first);
    if (l != last.end() && g->start_us < l->second - kEps) ++early;          // before the layer's last copy
  }
  EXPECT_GT(early, 0U);
}

TEST(OffloadStudy, NextLayerPrefetchOverlapsTheNextLayersFetchesWithThisLayersCompute) {
  SimResult none_r, next_r;
  simulate_records(offload_variant(scenarios::ExpertSync::barrier, scenarios::Prefetch::none, false), 2, &none_r);
  const RunData d = simulate_records(
      offload_variant(scenarios::ExpertSync::barrier, scenarios::Prefetch::next_layer, false), 2, &next_r);
  const auto gemms = first_gemm(d, 1);
  std::size_t overlapped = 0;
  for (const PhaseRecord* f : records_of(d, "expert_fetch_h2d", 1)) {
    for (const auto& [key, g] : gemms) {
      if (key.first == f->layer - 1 && overlap(f, g)) ++overlapped;
    }
  }
  EXPECT_GT(overlapped, 0U);
  EXPECT_LT(next_r.summary.steps[1].step_time_us, none_r.summary.steps[1].step_time_us);
  EXPECT_LT(next_r.summary.steps[1].inference->bubble_ratio, none_r.summary.steps[1].inference->bubble_ratio);
}

TEST(OffloadStudy, SummaryMetricsAgreeWithTheExpansion) {
  const scenarios::Scenario s = validation("offload", "dsv2lite_nvme_barrier_none");
  SimResult r;
  simulate_records(s, 3, &r);
  ASSERT_EQ(r.summary.steps.size(), 3U);
  for (const auto& st : r.summary.steps) {
    ASSERT_TRUE(st.inference.has_value());
    const profiler::InferenceStep& m = *st.inference;
    EXPECT_EQ(m.kind, st.step == 0 ? "prefill" : "decode");
    const scenarios::StepGraph g = scenarios::expand(s, st.step);
    const auto& rc = g.classes[0];
    ASSERT_TRUE(m.experts_activated && m.cache_hits);
    EXPECT_EQ(*m.experts_activated, rc.experts_activated);
    EXPECT_EQ(*m.cache_hits, rc.experts_cache_hits);
    // Every miss is fetched once (no prefetch): fetched = activated - hits, from disk then to the GPU.
    EXPECT_EQ(m.experts_fetched, rc.experts_activated - rc.experts_cache_hits);
    EXPECT_DOUBLE_EQ(m.bytes_fetched_disk, m.bytes_fetched_h2d);
    EXPECT_GT(m.bubble_ratio, 0.0);
    EXPECT_LT(m.bubble_ratio, 1.0);
    EXPECT_GT(m.sync_overhead_share, 0.0);
    EXPECT_DOUBLE_EQ(m.tokens, g.tokens);
  }
  EXPECT_DOUBLE_EQ(r.summary.steps[1].tokens_per_s, 8.0 / (r.summary.steps[1].step_time_us * 1e-6));
}

TEST(OffloadStudy, ExpansionCountsActivationsAndHitsAndNamesFetchesByLocalExpert) {
  const scenarios::Scenario s = validation("offload", "dsv2lite_host_pinned_per_expert_next_layer");
  for (int step = 0; step < 3; ++step) {
    const scenarios::StepGraph g = scenarios::expand(s, step);
    const auto& rc = g.classes[0];
    EXPECT_GT(rc.experts_activated, 0);
    EXPECT_GE(rc.experts_cache_hits, 0);
    EXPECT_LT(rc.experts_cache_hits, rc.experts_activated);
    for (const auto& op : rc.ops) {
      if (g.phase_name(op).rfind("expert_fetch", 0) == 0) {
        EXPECT_GE(op.expert, 0);
        EXPECT_LT(op.expert, s.model.num_experts);
      }
    }
  }
}

// ------------------------------------------------------------------ published Megatron-Core rows

TEST(ScaleValidation, PublishedRowsNameEveryScenarioOfTheFolderAndEachLoads) {
  const Json j = read_json_file(testing::source_dir() / "scenarios/validation/scale/published.json");
  std::set<std::string> named;
  for (const auto& row : j.at("rows")) {
    named.insert(row.at("scenario").get<std::string>());
    EXPECT_GT(row.at("published_tflops_per_gpu").get<double>(), 0.0);
  }
  std::set<std::string> files;
  for (const fs::path& f : suite_files("scale")) {
    files.insert(f.stem().string());
    const scenarios::Scenario s = scenarios::load_scenario(f);
    ASSERT_TRUE(s.train.has_value()) << f;
    EXPECT_EQ(s.train->seq_length, 4096) << f;
    EXPECT_EQ(s.cluster.gpu, scenarios::GpuKind::h100) << f;
  }
  EXPECT_EQ(named, files);
}

TEST(ScaleValidation, TflopsPerGpuIsMegatronsFormulaOverTheSimulatedStep) {
  const scenarios::Scenario s = validation("scale", "qwen3_30b_16gpu_h100_fp8");
  SimOptions o;
  o.fidelity = Fidelity::analytic;
  const SimResult r = simulate(s, "auto", o);
  const auto& step = r.summary.steps.at(0);
  const double expected = scenarios::megatron_flops_per_iteration(s) / (step.step_time_us * 1e-6) /
                          static_cast<double>(s.cluster.world_size()) / 1e12;
  EXPECT_NEAR(step.tflops_per_gpu, expected, 1e-9 * expected);
}

TEST(ScaleValidation, FlexDispatchAcrossNodesSendsOneCopyPerNodeOverTheNetwork) {
  // Qwen3-30B on two nodes (EP16): a token's 8 of 128 experts use the other node almost always, so
  // flex sends about one network copy where NCCL's all-to-all sends four. Each flex byte goes at
  // DeepEP's published EP16 bandwidth over its byte count (a token counted on both nodes: about half
  // of 43 GB/s, dispatch.flex.network), each all-to-all byte at the NCCL curve (about 35 GB/s at this
  // size): flex takes about half the time, not a quarter.
  scenarios::Scenario flex = validation("scale", "qwen3_30b_16gpu_h100_fp8");
  flex.train->global_batch_size = 16;
  scenarios::Scenario a2a = flex;
  a2a.train->exec.token_dispatcher = scenarios::Dispatcher::alltoall;
  SimOptions o;
  o.fidelity = Fidelity::analytic;
  auto dispatch_us = [&](const scenarios::Scenario& s) {
    const SimResult r = simulate(s, "auto", o);
    for (const auto& p : r.summary.phases) {
      if (p.phase == "moe_dispatch_fwd") return p.dur_us.median;
    }
    return -1.0;
  };
  const double f = dispatch_us(flex);
  const double a = dispatch_us(a2a);
  ASSERT_GT(f, 0.0);
  ASSERT_GT(a, 0.0);
  EXPECT_LT(f, 0.6 * a) << "flex " << f << " us, alltoall " << a << " us";
  EXPECT_GT(f, 0.3 * a) << "flex " << f << " us, alltoall " << a << " us";
}

TEST(ScaleValidation, TeSplitExpertsRunOneGemmPerExpertOverStreamsWithoutGatherOrScatter) {
  // expert_execution = "split:4", Transformer Engine's GroupedLinear on its multi-stream cuBLAS backend:
  // Qwen3-30B on EP16 has 8 local experts; per MoE layer and micro-batch, one fc1 GEMM per expert with
  // gate and up fused (2 x 768 wide) on stream slots 0, 1, 2, 3, 0, ..., one activation over all rows
  // after every fc1, one fc2 per expert after it, no per-expert gather or scatter; the backward has a
  // dgrad and a wgrad GEMM per expert and projection.
  scenarios::Scenario s = validation("scale", "qwen3_30b_16gpu_h100_fp8");
  s.train->global_batch_size = 16;
  s.train->exec.expert_execution = {scenarios::ExpertExecutionKind::split, 4};
  const scenarios::StepGraph g = scenarios::expand(s, 0);
  const auto& rc = g.classes[0];
  std::map<std::string, int> count;
  std::set<std::uint8_t> fc1_streams;
  for (const auto& op : rc.ops) {
    if (op.layer != 0 || op.microbatch != 0) continue;
    const std::string ph = g.phase_name(op);
    ++count[ph];
    if (ph == "expert_fc1_fwd") {
      EXPECT_EQ(op.shape[1], 2 * 768) << "gate and up in one GEMM";
      fc1_streams.insert(op.stream);
      ASSERT_GE(op.expert, 0);
    }
  }
  EXPECT_EQ(count["expert_fc1_fwd"], 8);
  EXPECT_EQ(count["expert_fc2_fwd"], 8);
  EXPECT_EQ(count["expert_act_fwd"], 1);
  EXPECT_EQ(count["expert_fc1_dgrad"], 8);
  EXPECT_EQ(count["expert_fc1_wgrad"], 8);
  EXPECT_EQ(count["expert_gather_fwd"], 0);
  EXPECT_EQ(count["expert_scatter_fwd"], 0);
  EXPECT_EQ(count["expert_gate_fwd"], 0);
  EXPECT_EQ(fc1_streams.size(), 4U);
  // The same scenario simulates, slower than with one grouped GEMM per projection (the per-expert
  // GEMMs of 8 x 4096 rows are smaller and pay a launch each).
  SimOptions o;
  o.fidelity = Fidelity::analytic;
  scenarios::Scenario grouped = s;
  grouped.train->exec.expert_execution = {scenarios::ExpertExecutionKind::grouped, 1};
  EXPECT_GT(simulate(s, "auto", o).summary.step_time_us.median,
            simulate(grouped, "auto", o).summary.step_time_us.median);
}

// ------------------------------------------------------------------ inference at scale

// Data-parallel inference replicas do not communicate: a world of 100,000 one-GPU replicas (one rank
// class) simulates in flow fidelity on a platform of the GPUs its flows reach, not of 100,000 SimGrid
// hosts (1.2 GiB more peak memory and 13 s of CPU when it built them all), with the one-GPU step
// times. Each in a child of its own: SimGrid runs one engine per process.
TEST(InferenceScale, AHundredThousandReplicasSimulateInFlowFidelityAsOne) {
  auto run = [](int nodes) {
    return testing::in_child([nodes]() {
      const fs::path file =
          testing::source_dir() / "scenarios/validation/host_overhead/switch_d768_t4k_sequential_none.toml";
      std::string text = read_input_file(file, "scenario file");
      const std::string one_node = "\nnodes = 1\n";
      text.replace(text.find(one_node), one_node.size(), "\nnodes = " + std::to_string(nodes) + "\n");
      text += "ranks = \"representatives\"\n";  // [run.profiler] is the file's last table
      scenarios::Scenario s = scenarios::load_scenario_text(text, file.string()).scenario;
      s.run.profiler.enabled = false;
      SimOptions o;
      o.fidelity = Fidelity::flow;
      o.steps = 3;
      rusage before{};
      getrusage(RUSAGE_SELF, &before);
      const SimResult r = simulate(s, "auto", o);
      rusage after{};
      getrusage(RUSAGE_SELF, &after);
      std::string out = std::to_string(after.ru_maxrss - before.ru_maxrss);
      for (const auto& st : r.summary.steps) out += " " + std::to_string(st.step_time_us);
      return out;
    });
  };
  const std::string one = run(1);
  const std::string many = run(100000);
  ASSERT_EQ(one.rfind("CHILD FAILED", 0), std::string::npos) << one;
  ASSERT_EQ(many.rfind("CHILD FAILED", 0), std::string::npos) << many;
  EXPECT_EQ(one.substr(one.find(' ')), many.substr(many.find(' ')));
  EXPECT_LT(std::stol(many), 512L * 1024) << "peak RSS grew by " << many.substr(0, many.find(' ')) << " KiB";
}

}  // namespace
}  // namespace threewalls::sim
