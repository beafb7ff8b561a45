// The discrete-event executor on hand-made StepGraphs with closed-form costs, analytic fidelity (no
// SimGrid engine): streams, dependencies, the host lane, CUDA graphs, collectives, pipelines.
// GCC 12 at -O2/-O3 reports a -Wrestrict false positive inside libstdc++ for "literal" +
// std::to_string(...) (a known GCC 12 false positive); Release builds of this file printed it.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include <gtest/gtest.h>

#include <cmath>

#include "sim_test_support.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/profiler/walls.hpp"
#include "threewalls/sim/executor.hpp"

namespace threewalls::sim {
namespace {

using testing::FakeCoster;
using testing::GraphBuilder;
using scenarios::Collective;
using scenarios::Group;
using scenarios::HostKind;
using scenarios::Op;
using scenarios::OpKind;
using scenarios::StreamKind;

constexpr double kUs = 1e-6;

StepResult run(const GraphBuilder& b, const FakeCoster& coster, const scenarios::ClusterSpec& cl,
               std::vector<double> factor = {}, scenarios::Framework framework = scenarios::Framework::cpp) {
  const Platform p(cl);
  ExecutorOptions o;
  o.fidelity = Fidelity::analytic;
  o.framework = framework;
  return Executor(coster, o).run_step(b.g, p, factor, 0.0, nullptr);
}

TEST(Executor, OpsOfOneStreamRunInFifoOrder) {
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  b.add(c, b.kernel(10, "a"));
  b.add(c, b.kernel(20, "b"));
  b.add(c, b.kernel(5, "c"));
  const auto r = run(b, FakeCoster{}, testing::cluster(1, 1));
  const auto& t = r.classes[0];
  EXPECT_NEAR(t.start[1], 10 * kUs, 1e-12);
  EXPECT_NEAR(t.start[2], 30 * kUs, 1e-12);
  EXPECT_NEAR(r.duration, 35 * kUs, 1e-12);
}

// A cost that is NaN or infinite (a profile value or a rate past what the readers allow) once reached
// the output as "step time -nan" and "dur_us": null; it is an input error naming the op.
TEST(Executor, ANonFiniteCostIsAnErrorNamingTheOp) {
  for (const double bad : {std::nan(""), HUGE_VAL, -1.0}) {
    GraphBuilder b(1, 1, 1, 1, 1, 1);
    const int c = b.add_class({0});
    b.add(c, b.kernel(10, "fine"));
    b.add(c, b.kernel(bad, "broken"));
    try {
      (void)run(b, FakeCoster{}, testing::cluster(1, 1));
      ADD_FAILURE() << "a cost of " << bad << " was accepted";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("op 1 'broken' (gemm)"), std::string::npos) << what;
      EXPECT_NE(what.find("the cost model gives a"), std::string::npos) << what;
      EXPECT_NE(what.find("a calibration profile value or a cluster rate or latency is out of range"),
                std::string::npos)
          << what;
    }
  }
}

TEST(Executor, CrossStreamDependencyDelaysTheStart) {
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  const auto a = b.add(c, b.kernel(10, "a"));
  b.add(c, b.kernel(3, "side", "side"), {a});
  const auto r = run(b, FakeCoster{}, testing::cluster(1, 1));
  EXPECT_NEAR(r.classes[0].start[1], 10 * kUs, 1e-12);
  EXPECT_NEAR(r.duration, 13 * kUs, 1e-12);
}

TEST(Executor, ConcurrentKernelsShareTheGpu) {
  // Two 10 us kernels on two streams. Without concurrency gain they take 20 us together; with a
  // throughput factor of 1.6 they take 12.5 us.
  for (double conc : {1.0, 1.6}) {
    GraphBuilder b(1, 1, 1, 1, 1, 1);
    const int c = b.add_class({0});
    b.add(c, b.kernel(10, "a", "s1"));
    b.add(c, b.kernel(10, "b", "s2"));
    FakeCoster f;
    f.concurrency = conc;
    const auto r = run(b, f, testing::cluster(1, 1));
    EXPECT_NEAR(r.duration, 20 * kUs / conc, 1e-12) << conc;
    EXPECT_NEAR(r.classes[0].end[0], r.classes[0].end[1], 1e-12);
  }
}

TEST(Executor, LaunchBoundStepShowsGpuGaps) {
  // 10 kernels of 2 us, each launch costs 10 us on the host: the GPU waits for the host.
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  for (int i = 0; i < 10; ++i) b.add(c, b.kernel(2, "k"));
  FakeCoster f;
  f.host.kernel_launch = microseconds(10);
  const auto r = run(b, f, testing::cluster(1, 1));
  EXPECT_NEAR(r.duration, (10 * 10 + 2) * kUs, 1e-12);
  std::vector<profiler::TimelineOp> tl;
  for (std::size_t i = 0; i < 10; ++i) {
    tl.push_back({r.classes[0].start[i] * 1e6, r.classes[0].end[i] * 1e6, profiler::Wall::compute, false});
  }
  const auto w = profiler::sweep_walls(tl, r.duration * 1e6);
  EXPECT_NEAR(w.compute_us, 20.0, 1e-6);
  EXPECT_NEAR(w.host_us, 82.0, 1e-6);
}

TEST(Executor, CudaGraphRunCostsOneLaunchPlusPerNodeDeviceTime) {
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  for (int i = 0; i < 10; ++i) {
    Op op = b.kernel(2, "k");
    op.graph = 1;
    b.add(c, op);
  }
  b.g.graphs.push_back("attn");
  b.g.classes[0].graph_runs.push_back({0, 10, 1});
  FakeCoster f;
  f.host.kernel_launch = microseconds(10);
  f.host.graph_launch = microseconds(7);
  f.host.graph_node = microseconds(1);
  const auto r = run(b, f, testing::cluster(1, 1));
  EXPECT_NEAR(r.duration, (7 + 10 * (2 + 1)) * kUs, 1e-12);
}

TEST(Executor, StreamSyncBlocksTheHostUntilItsDependencyFinishes) {
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  const auto k = b.add(c, b.kernel(50, "long"));
  b.add(c, b.host(HostKind::stream_sync, "sync"), {k});
  b.add(c, b.kernel(1, "after"));
  FakeCoster f;
  f.host.kernel_launch = microseconds(2);
  f.host.stream_sync = microseconds(3);
  const auto r = run(b, f, testing::cluster(1, 1));
  const auto& t = r.classes[0];
  EXPECT_NEAR(t.start[0], 2 * kUs, 1e-12);
  EXPECT_NEAR(t.end[0], 52 * kUs, 1e-12);
  EXPECT_NEAR(t.start[1], 52 * kUs, 1e-12);  // the host waited
  EXPECT_NEAR(t.end[1], 55 * kUs, 1e-12);
  EXPECT_NEAR(t.start[2], 57 * kUs, 1e-12);  // launched after the sync
}

TEST(Executor, RingAllReduceTakesItsClosedForm) {
  // n GPUs of one node: alpha + 2(n-1)/n S / B.
  const int n = 8;
  const double S = 256e6;
  GraphBuilder b(n, 1, 1, 1, 1, n);
  const int c = b.add_class({0, 1, 2, 3, 4, 5, 6, 7});
  b.add(c, b.collective(Collective::all_reduce, Group::tp, S, "ar"));
  FakeCoster f;
  f.alpha = microseconds(2 * (n - 1) * 1.0);
  f.busbw = BytesPerSecond(400e9);
  const auto r = run(b, f, testing::cluster(n, 1));
  EXPECT_NEAR(r.duration, f.alpha.value + 2.0 * (n - 1) / n * S / 400e9, 1e-12);
}

TEST(Executor, TreeAndRingAllReduceTakeTheProfilesTimeWhenLinksAllowIt) {
  // 4 nodes x 2 GPUs, DP 8 over all: two rails, so either algorithm alone takes
  // alpha + max(traffic / 2 / busbw(network), traffic / 2 / busbw(nvlink)), traffic = 2(n-1)/n S.
  const double S = 64e6;
  for (AllReduceChoice algo : {AllReduceChoice::ring, AllReduceChoice::tree}) {
    GraphBuilder b(1, 1, 8, 1, 1, 2);
    b.class_per_rank();
    for (int c = 0; c < 8; ++c) b.add(c, b.collective(Collective::all_reduce, Group::dp, S, "ar"));
    FakeCoster f;
    f.alpha = microseconds(30);
    f.busbw = BytesPerSecond(20e9);
    const Platform p(testing::cluster(2, 4));
    ExecutorOptions o;
    o.fidelity = Fidelity::analytic;
    o.allreduce = algo;
    const auto r = Executor(f, o).run_step(b.g, p, {}, 0.0, nullptr);
    EXPECT_NEAR(r.classes[0].end[0] - r.classes[0].start[0], 30e-6 + 2.0 * 7 / 8 * S / 2.0 / 20e9, 1e-12)
        << to_string(algo);
  }
}

TEST(Executor, AFlexDispatchSendsItsNetworkBytesAtTheProfilesRdmaBandwidth) {
  // EP 8 over 8 nodes of one GPU: a token's one copy (top-1 of 8 experts) goes to another node with
  // probability 7/8. Without dispatch.flex.network the bytes go at the network all-to-all curve's bus
  // bandwidth; with it, at its bandwidth over DeepEP's byte count (rdma_count_factor).
  const double S = 64e6;
  auto dispatch_time = [&](std::optional<BytesPerSecond> rdma) {
    GraphBuilder b(1, 1, 8, 1, 8, 1);
    b.class_per_rank();
    for (int c = 0; c < 8; ++c) {
      Op op = b.collective(Collective::all_to_all, Group::ep, S, "moe_dispatch");
      op.shape = {static_cast<std::int64_t>(S), 1, 0, 0, 0, 0};
      b.add(c, op);
    }
    FakeCoster f;
    f.busbw = BytesPerSecond(20e9);
    f.expert_dispatch_bw = rdma;
    const Platform p(testing::cluster(1, 8));
    ExecutorOptions o;
    o.fidelity = Fidelity::analytic;
    o.dispatch = {DispatchKind::flex, 8, 1, 0, 0};
    const auto r = Executor(f, o).run_step(b.g, p, {}, 0.0, nullptr);
    return r.classes[0].end[0] - r.classes[0].start[0];
  };
  const double curve = dispatch_time(std::nullopt);
  EXPECT_NEAR(curve, S * 7.0 / 8.0 / 20e9, 1e-12);
  // DeepEP's count: a token uses its own node with probability 1/8 and one other with 7/8, so the
  // published bandwidth is over 8/7 of the network bytes.
  EXPECT_NEAR(dispatch_time(BytesPerSecond(40e9)), S * 7.0 / 8.0 * (8.0 / 7.0) / 40e9, 1e-12);
}

TEST(Executor, ACollectiveWaitsForItsLastMemberAndEndsForAllTogether) {
  GraphBuilder b(2, 1, 1, 1, 1, 2);
  b.class_per_rank();
  b.add(0, b.kernel(10, "pre"));
  b.add(0, b.collective(Collective::all_reduce, Group::tp, 1e6, "ar", "compute"));
  b.add(1, b.kernel(30, "pre"));
  b.add(1, b.collective(Collective::all_reduce, Group::tp, 1e6, "ar", "compute"));
  FakeCoster f;
  f.busbw = BytesPerSecond(100e9);
  const auto r = run(b, f, testing::cluster(2, 1));
  const double dur = 2.0 * 1 / 2 * 1e6 / 100e9;
  EXPECT_NEAR(r.classes[0].start[1], 10 * kUs, 1e-12);  // its own arrival
  EXPECT_NEAR(r.classes[1].start[1], 30 * kUs, 1e-12);
  EXPECT_NEAR(r.classes[0].end[1], 30 * kUs + dur, 1e-12);
  EXPECT_NEAR(r.classes[1].end[1], 30 * kUs + dur, 1e-12);
}

// A 1F1B pipeline of p stages and m micro-batches, forward F, backward 2F, free communication.
GraphBuilder one_f_one_b(int p, int m, double F) {
  GraphBuilder b(1, 1, 1, p, 1, p);
  b.class_per_rank();
  for (int s = 0; s < p; ++s) {
    std::vector<std::uint32_t> fwd_done(static_cast<std::size_t>(m));
    auto fwd = [&](int mb) {
      std::uint32_t dep = 0;
      bool has = false;
      if (s > 0) {
        dep = b.add(s, b.p2p(false, -1, mb, 0, "recv_fwd", "fwd_recv", mb));
        has = true;
      }
      const auto k = has ? b.add(s, b.kernel(F, "fwd", "compute", mb), {dep}) : b.add(s, b.kernel(F, "fwd", "compute", mb));
      if (s < p - 1) b.add(s, b.p2p(true, +1, mb, 0, "send_fwd", "fwd_send", mb), {k});
    };
    auto bwd = [&](int mb) {
      std::uint32_t dep = 0;
      bool has = false;
      if (s < p - 1) {
        dep = b.add(s, b.p2p(false, +1, mb, 0, "recv_bwd", "bwd_recv", mb));
        has = true;
      }
      const auto k =
          has ? b.add(s, b.kernel(2 * F, "bwd", "compute", mb), {dep}) : b.add(s, b.kernel(2 * F, "bwd", "compute", mb));
      if (s > 0) b.add(s, b.p2p(true, -1, mb, 0, "send_bwd", "bwd_send", mb), {k});
    };
    const int warmup = std::min(p - s - 1, m);
    int f = 0;
    int bk = 0;
    for (; f < warmup; ++f) fwd(f);
    while (f < m) {
      fwd(f++);
      bwd(bk++);
    }
    while (bk < m) bwd(bk++);
  }
  return b;
}

TEST(Executor, OneFOneBBubbleIsPMinusOneOverMPlusPMinusOne) {
  const int p = 4;
  const int m = 8;
  const double F = 100;
  GraphBuilder b = one_f_one_b(p, m, F);
  FakeCoster f;
  auto cl = testing::cluster(p, 1);
  const auto r = run(b, f, cl);
  EXPECT_NEAR(r.duration, (m + p - 1) * 3 * F * kUs, 1e-9);
  // The walls of stage 0: compute m (F + 2F), the rest waiting for pipeline peers.
  const auto& rc = b.g.classes[0];
  std::vector<profiler::TimelineOp> tl;
  for (std::size_t i = 0; i < rc.ops.size(); ++i) {
    const bool pipe = rc.ops[i].kind != OpKind::gemm;
    tl.push_back({r.classes[0].start[i] * 1e6, r.classes[0].end[i] * 1e6,
                  pipe ? profiler::Wall::communication : profiler::Wall::compute, pipe});
  }
  const auto w = profiler::sweep_walls(tl, r.duration * 1e6);
  EXPECT_NEAR(w.bubble_us / (r.duration * 1e6), static_cast<double>(p - 1) / (m + p - 1), 1e-9);
  EXPECT_NEAR(w.compute_us, m * 3 * F, 1e-6);
}

TEST(Executor, ASendWithoutItsRecvIsReportedAsADeadlock) {
  GraphBuilder b(1, 1, 1, 2, 1, 2);
  b.class_per_rank();
  b.add(0, b.p2p(true, +1, 7, 100, "send_fwd", "pp"));
  b.add(1, b.kernel(1, "k"));
  try {
    run(b, FakeCoster{}, testing::cluster(2, 1));
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("deadlock"), std::string::npos) << what;
    EXPECT_NE(what.find("send_fwd"), std::string::npos) << what;
    EXPECT_NE(what.find("tag 7"), std::string::npos) << what;
  }
}

TEST(Executor, ACollectiveAMemberNeverIssuesIsReportedAsADeadlock) {
  GraphBuilder b(2, 1, 1, 1, 1, 2);
  b.class_per_rank();
  b.add(0, b.collective(Collective::all_gather, Group::tp, 1e6, "ag"));
  b.add(1, b.kernel(1, "k"));
  EXPECT_THROW(run(b, FakeCoster{}, testing::cluster(2, 1)), InputError);
}

TEST(Executor, ADependencyOnALaterOpIsInputError) {
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  b.add(c, b.kernel(1, "a"), {1});
  b.add(c, b.kernel(1, "b"));
  EXPECT_THROW(run(b, FakeCoster{}, testing::cluster(1, 1)), InputError);
}

TEST(Executor, GpuSlowdownScalesTheClassesKernels) {
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  b.add(c, b.kernel(10, "a"));
  const auto r = run(b, FakeCoster{}, testing::cluster(1, 1), {2.5});
  EXPECT_NEAR(r.duration, 25 * kUs, 1e-12);
}

Op copy_op(GraphBuilder& b, scenarios::CopyKind kind, double bytes, const std::string& ph, const std::string& st) {
  Op cp;
  cp.kind = OpKind::copy;
  cp.sub = static_cast<std::uint8_t>(kind);
  cp.wall = scenarios::Wall::memory;
  cp.bytes = bytes;
  cp.phase = b.phase(ph);
  cp.stream = b.stream(st, StreamKind::copy);
  return cp;
}

TEST(Executor, HostToDeviceCopyTakesTheProfilesTime) {
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  b.add(c, copy_op(b, scenarios::CopyKind::h2d_pinned, 32e6, "h2d", "copy"));
  FakeCoster f;
  f.copy_bw = BytesPerSecond(25e9);
  const auto r = run(b, f, testing::cluster(1, 1));
  EXPECT_NEAR(r.duration, 32e6 / 25e9, 1e-12);
}

StepResult run_timed(const GraphBuilder& b, const FakeCoster& coster, Timing timing,
                     scenarios::Framework framework = scenarios::Framework::cpp, int queues = 8) {
  const Platform p(testing::cluster(1, 1));
  ExecutorOptions o;
  o.fidelity = Fidelity::analytic;
  o.framework = framework;
  o.hardware_queues = queues;
  const std::vector<Timing> t(b.g.classes.size(), timing);
  return Executor(coster, o).run_step(b.g, p, {}, 0.0, nullptr, t);
}

TEST(Executor, EventsAndWaitsAcrossStreamsCostHostTimeAsThreewallsRunIssuesThem) {
  // a (compute) -> b (side) -> c (compute), 1 us kernels, launches of 10 us, events of 1 us.
  // Host: fence 2 e (two streams); a: launch, then an event (b waits for it) -> 13; b: wait + launch
  // -> 24, event -> 25; c: wait + launch -> 36; join 2 e -> 38. The step ends with the join.
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  const auto a = b.add(c, b.kernel(1, "a"));
  const auto s = b.add(c, b.kernel(1, "b", "side"), {a});
  b.add(c, b.kernel(1, "c"), {s});
  FakeCoster f;
  f.host.kernel_launch = microseconds(10);
  f.host.event_record = microseconds(1);
  const auto r = run(b, f, testing::cluster(1, 1));
  const auto& t = r.classes[0];
  EXPECT_NEAR(t.start[0], 12 * kUs, 1e-12);
  EXPECT_NEAR(t.start[1], 24 * kUs, 1e-12);
  EXPECT_NEAR(t.start[2], 36 * kUs, 1e-12);
  EXPECT_NEAR(t.step_end, 38 * kUs, 1e-12);
  EXPECT_NEAR(r.duration, 38 * kUs, 1e-12);
}

TEST(Executor, TimingMarkersOfARecordedStepCostTwoEventsPerTimedOp) {
  // Three 1 us kernels on one stream, launches of 10 us, events of 1 us. Untimed: fence 1, launches
  // end at 11, 21, 31, step 32. Timed (two markers per op): 12, 24, 36, step 37.
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  for (int i = 0; i < 3; ++i) b.add(c, b.kernel(1, "k"));
  b.g.classes[0].ops[0].flags = scenarios::kDataLoad;  // in the coarse view
  FakeCoster f;
  f.host.kernel_launch = microseconds(10);
  f.host.event_record = microseconds(1);
  EXPECT_NEAR(run_timed(b, f, Timing::none).duration, 32 * kUs, 1e-12);
  const auto timed = run_timed(b, f, Timing::every_op);
  EXPECT_NEAR(timed.classes[0].start[2], 36 * kUs, 1e-12);
  EXPECT_NEAR(timed.duration, 37 * kUs, 1e-12);
  // Coarse granularity times only the coarse-view op: 12 + 1, then 23, 33, step 34.
  EXPECT_NEAR(run_timed(b, f, Timing::coarse_ops).duration, 34 * kUs, 1e-12);
}

TEST(Executor, TheExecutorPathCostsOpDispatchPerLaunchAndRecordOpPerRecordedOp) {
  // As above (three 1 us kernels, launches of 10 us, events of 1 us) with OpRunner's dispatch of 2 us
  // per launch and a recorded op's path of 4 us (its start marker, 1 us, before the launch, 3 us
  // after). Untimed: fence 1, launches end at 13, 25, 37, step 38. Timed: 14, 30, 46, step 49 (the
  // last op's 3 us after its launch).
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  for (int i = 0; i < 3; ++i) b.add(c, b.kernel(1, "k"));
  FakeCoster f;
  f.host.kernel_launch = microseconds(10);
  f.host.event_record = microseconds(1);
  f.host.op_dispatch = microseconds(2);
  f.host.record_op = microseconds(4);
  EXPECT_NEAR(run_timed(b, f, Timing::none).duration, 38 * kUs, 1e-12);
  const auto timed = run_timed(b, f, Timing::every_op);
  EXPECT_NEAR(timed.classes[0].start[0], 14 * kUs, 1e-12);
  EXPECT_NEAR(timed.classes[0].start[2], 46 * kUs, 1e-12);
  EXPECT_NEAR(timed.duration, 49 * kUs, 1e-12);
  // A pytorch_eager step pays the framework's recording (host.framework_record_op, the reference
  // runner's phases: 9 us) in place of record_op, split the same way (the start marker before the
  // launch, 8 us after): 14, 14 + 8 + 13 = 35, 56, step 64; a C++ step keeps record_op.
  f.host.framework_record_op = microseconds(9);
  const auto eager = run_timed(b, f, Timing::every_op, scenarios::Framework::pytorch_eager);
  EXPECT_NEAR(eager.classes[0].start[0], 14 * kUs, 1e-12);
  EXPECT_NEAR(eager.classes[0].start[1], 35 * kUs, 1e-12);
  EXPECT_NEAR(eager.classes[0].start[2], 56 * kUs, 1e-12);
  EXPECT_NEAR(eager.duration, 64 * kUs, 1e-12);
  EXPECT_NEAR(run_timed(b, f, Timing::every_op).duration, 49 * kUs, 1e-12);
}

TEST(Executor, TimingMarkersOfARecordedStepHoldTheStreamForTheirDeviceTime) {
  // Three 10 us kernels on one stream, launches of 1 us (the host runs ahead), markers of 2 us of
  // device time. Untimed: kernels end at 11, 21, 31. Timed: the first kernel holds its stream for its
  // two markers too (14 us): 15; the next ones start at the previous kernel's end marker (shared
  // boundary markers, docs/profiler.md: the device is behind the host) and hold it for their end
  // marker only (12 us): 27, 39, as back-to-back recorded kernels of threewalls run.
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  for (int i = 0; i < 3; ++i) b.add(c, b.kernel(10, "k"));
  FakeCoster f;
  f.host.kernel_launch = microseconds(1);
  f.host.timing_marker = microseconds(2);
  EXPECT_NEAR(run_timed(b, f, Timing::none).duration, 31 * kUs, 1e-12);
  const auto timed = run_timed(b, f, Timing::every_op);
  EXPECT_NEAR(timed.classes[0].end[0], 15 * kUs, 1e-12);
  EXPECT_NEAR(timed.classes[0].end[1], 27 * kUs, 1e-12);
  EXPECT_NEAR(timed.duration, 39 * kUs, 1e-12);
  // The first start marker runs on the idle stream when the host records it (0), its timestamp
  // after its device time: the record is 2 to 15 (the launch, the kernel and the end marker); the
  // next record starts at that end marker: 15 to 27 (the device is behind the host).
  EXPECT_NEAR(timed.classes[0].record_start[0], 2 * kUs, 1e-12);
  EXPECT_NEAR(timed.classes[0].record_end[0], 15 * kUs, 1e-12);
  EXPECT_NEAR(timed.classes[0].record_start[1], 15 * kUs, 1e-12);
  EXPECT_NEAR(timed.classes[0].record_end[1], 27 * kUs, 1e-12);
}

TEST(Executor, CrossStreamWaitsCostTheProfilesStreamWait) {
  // a (compute) then b (side, waits for a): launches 10 us, events 1 us, 1 us kernels. The host pays
  // a stream wait three times: the side stream's fence behind the epoch, b's wait for a, and the
  // anchor's wait in the step's join. Without host.stream_wait each is an event record (1 us); with
  // it (5 us) the step, host-bound, is 3 x 4 us longer.
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  const auto a = b.add(c, b.kernel(1, "a"));
  b.add(c, b.kernel(1, "b", "side"), {a});
  FakeCoster f;
  f.host.kernel_launch = microseconds(10);
  f.host.event_record = microseconds(1);
  const double plain = run_timed(b, f, Timing::none).duration;
  f.host.stream_wait = microseconds(1);
  EXPECT_NEAR(run_timed(b, f, Timing::none).duration, plain, 1e-12);
  f.host.stream_wait = microseconds(5);
  EXPECT_NEAR(run_timed(b, f, Timing::none).duration, plain + 12 * kUs, 1e-12);
}

TEST(Executor, ACrossStreamWaitBreaksTheSharingOfTimingMarkers) {
  // k0 (compute, 10 us), x (side, 1 us), k1 (compute, 10 us); launches 1 us, markers 2 us. Without
  // a dependency k1 shares k0's end marker: 1..15, then 15..27. When k1 waits for x (another
  // stream), a wait sits between the two on the stream: k1 records its own start marker, 15..29.
  // x runs beside k0 without slowing it (concurrency 2: two streams at full rate each).
  FakeCoster f;
  f.host.kernel_launch = microseconds(1);
  f.host.timing_marker = microseconds(2);
  f.concurrency = 2.0;
  for (const bool wait : {false, true}) {
    GraphBuilder b(1, 1, 1, 1, 1, 1);
    const int c = b.add_class({0});
    b.add(c, b.kernel(10, "k0"));
    const auto x = b.add(c, b.kernel(1, "x", "side"));
    if (wait) {
      b.add(c, b.kernel(10, "k1"), {x});
    } else {
      b.add(c, b.kernel(10, "k1"));
    }
    const auto timed = run_timed(b, f, Timing::every_op);
    EXPECT_NEAR(timed.classes[0].end[2], (wait ? 29 : 27) * kUs, 1e-12) << (wait ? "waits" : "no wait");
  }
}

TEST(Executor, AnIdleStreamGetsAFreshStartMarker) {
  // Events of 10 us on the host, launches 1 us, 1 us kernels, markers 2 us: k0 runs 21..26; when
  // the host comes to k1 (31: k0's launch and end marker recorded) the stream has passed k0's end
  // marker, so k1 records its own start marker (its record must not include the idle stream):
  // recorded at 41, it runs then (43 after its device time), k1 is launched at 42 and holds the
  // stream for two markers, 42..47; its record 43..47 holds the launch.
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  for (int i = 0; i < 2; ++i) b.add(c, b.kernel(1, "k"));
  FakeCoster f;
  f.host.kernel_launch = microseconds(1);
  f.host.event_record = microseconds(10);
  f.host.timing_marker = microseconds(2);
  const auto timed = run_timed(b, f, Timing::every_op);
  EXPECT_NEAR(timed.classes[0].end[0], 26 * kUs, 1e-12);
  EXPECT_NEAR(timed.classes[0].start[1], 42 * kUs, 1e-12);
  EXPECT_NEAR(timed.classes[0].end[1], 47 * kUs, 1e-12);
  EXPECT_NEAR(timed.classes[0].record_start[1], 43 * kUs, 1e-12);
}

TEST(Executor, ARecordOnAnIdleStreamHoldsTheHostsWorkBetweenItsStartMarkerAndTheLaunch) {
  // A PyTorch eager op whose body costs the host 50 us between the phase's start stamp and its
  // kernel's launch: a CUDA event on an idle stream completes at its record call, not at the next
  // launch (docs/validation/python_profiler_overhead_h200_2026-11-29.md, "Where a stamp lands": a
  // stamp, 50 us on the host, a 2 us kernel, a stamp: 61 us apart). Markers of 1 us, events 2 us.
  // The host records the step's epoch (2) and the start marker (4); the launch returns at 54, the
  // kernel runs 54..56 plus its markers (58): the record is 5..58 (the body and the kernel), not
  // only the kernel, and 49 us of it waited for the launch.
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  b.add(c, b.kernel(2, "k"));
  FakeCoster f;
  f.host.kernel_launch = microseconds(50);
  f.host.event_record = microseconds(2);
  f.host.timing_marker = microseconds(1);
  const auto timed = run_timed(b, f, Timing::every_op);
  EXPECT_NEAR(timed.classes[0].start[0], 54 * kUs, 1e-12);
  EXPECT_NEAR(timed.classes[0].end[0], 58 * kUs, 1e-12);
  EXPECT_NEAR(timed.classes[0].record_start[0], 5 * kUs, 1e-12);
  EXPECT_NEAR(timed.classes[0].record_end[0], 58 * kUs, 1e-12);
  EXPECT_NEAR(timed.classes[0].launch_wait[0], 49 * kUs, 1e-12);
}

TEST(Executor, DiskReadsRunOnTheHostLaneAndHoldBackLaterLaunches) {
  // A 20 us disk read feeding a 20 us host-to-device copy, then an independent kernel. The read
  // occupies the host (as threewalls run reads into a pinned buffer on the rank's thread), so the
  // copy is launched at 25 and the kernel only at 30.
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  const auto d = b.add(c, copy_op(b, scenarios::CopyKind::disk_read, 1e6, "expert_fetch_disk", "disk"));
  b.add(c, copy_op(b, scenarios::CopyKind::h2d_pinned, 1e6, "expert_fetch_h2d", "copy"), {d});
  b.add(c, b.kernel(1, "k"));
  FakeCoster f;
  f.host.kernel_launch = microseconds(5);
  const auto r = run(b, f, testing::cluster(1, 1));
  const auto& t = r.classes[0];
  EXPECT_NEAR(t.start[0], 0.0, 1e-12);
  EXPECT_NEAR(t.end[0], 20 * kUs, 1e-12);
  EXPECT_NEAR(t.start[1], 25 * kUs, 1e-12);
  EXPECT_NEAR(t.end[1], 45 * kUs, 1e-12);
  EXPECT_NEAR(t.start[2], 30 * kUs, 1e-12);
}

TEST(Executor, CopiesOnTwoCopyStreamsShareThePcieLinkInAnalyticFidelity) {
  // Two 20 us host-to-device copies on two copy streams: the link carries one after the other's
  // bandwidth, 40 us in all (a second copy stream does not double PCIe).
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  b.add(c, copy_op(b, scenarios::CopyKind::h2d_pinned, 1e6, "fetch", "copy"));
  b.add(c, copy_op(b, scenarios::CopyKind::h2d_pinned, 1e6, "fetch", "copy_1"));
  b.add(c, copy_op(b, scenarios::CopyKind::d2h_pinned, 1e6, "offload", "copy_2"));
  const auto r = run(b, FakeCoster{}, testing::cluster(1, 1));
  EXPECT_NEAR(r.classes[0].end[0], 20 * kUs, 1e-12);
  EXPECT_NEAR(r.classes[0].end[1], 40 * kUs, 1e-12);
  EXPECT_NEAR(r.classes[0].end[2], 20 * kUs, 1e-12);  // the other direction has its own link
}

TEST(Executor, GraphRunWaitsForOutsideDepsOnItsLaunchStreamAndJoinsItsOtherStreams) {
  // x (side) then a graph run of a (compute) and b (side2, depending on a), then y (compute)
  // depending on b. Events 1 us, graph launch 7, kernel launch 10, graph node 0, kernels 1 us.
  // Host: fence 3 e -> 3; x launched at 13, event (the run waits for it) -> 14; the run: one wait
  // for x, 2 e for its other stream, launch 7 -> 24; end event + 1 per other stream -> 26;
  // y: waits for b (in a run) 1 + launch 10 -> 37.
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  const auto x = b.add(c, b.kernel(1, "x", "side"));
  Op a = b.kernel(1, "a");
  a.graph = 1;
  const auto ia = b.add(c, a, {x});
  Op bb = b.kernel(1, "b", "side2");
  bb.graph = 1;
  const auto ib = b.add(c, bb, {ia});
  b.add(c, b.kernel(1, "y"), {ib});
  b.g.graphs.push_back("attn");
  b.g.classes[0].graph_runs.push_back({1, 3, 1});
  FakeCoster f;
  f.host.kernel_launch = microseconds(10);
  f.host.graph_launch = microseconds(7);
  f.host.event_record = microseconds(1);
  const auto r = run(b, f, testing::cluster(1, 1));
  const auto& t = r.classes[0];
  EXPECT_NEAR(t.start[0], 13 * kUs, 1e-12);
  EXPECT_NEAR(t.start[1], 24 * kUs, 1e-12);
  EXPECT_NEAR(t.start[2], 25 * kUs, 1e-12);  // after a, inside the replay
  EXPECT_NEAR(t.start[3], 37 * kUs, 1e-12);
}

// ---- hardware work queues and library-call launch costs ----

StepResult run_with_queues(const GraphBuilder& b, const FakeCoster& coster, int queues, int gpus = 1) {
  const Platform p(testing::cluster(gpus, 1));
  ExecutorOptions o;
  o.fidelity = Fidelity::analytic;
  o.hardware_queues = queues;
  return Executor(coster, o).run_step(b.g, p, {}, 0.0, nullptr);
}

TEST(Executor, SixteenStreamsOnEightHardwareQueuesSerialisePairwise) {
  // 16 streams, each two 10 us kernels issued stream by stream. The GPU runs any number of kernels
  // at full speed (concurrency clamps to k), so only the queues order them. With 8 queues, stream s
  // and stream s + 8 share queue s: stream s + 8's first kernel is issued behind stream s's second,
  // which is dispatched only when stream s's first has finished (its stream), so stream s + 8 starts
  // at 10 us and the step takes 30 us. With a queue per stream (16, or 0 = unlimited) all 16 streams
  // start at once: 20 us.
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  for (int st = 0; st < 16; ++st) {
    const std::string name = "s" + std::to_string(st);
    b.add(c, b.kernel(10, "k1", name));
    b.add(c, b.kernel(10, "k2", name));
  }
  FakeCoster f;
  f.concurrency = 1e9;
  const auto shared = run_with_queues(b, f, 8);
  for (int st = 0; st < 16; ++st) {
    const auto first = static_cast<std::size_t>(2 * st);
    const double want = st < 8 ? 0.0 : 10 * kUs;
    EXPECT_NEAR(shared.classes[0].start[first], want, 1e-12) << "stream " << st;
    EXPECT_NEAR(shared.classes[0].end[first + 1], want + 20 * kUs, 1e-12) << "stream " << st;
  }
  EXPECT_NEAR(shared.duration, 30 * kUs, 1e-12);
  for (const int queues : {16, 0}) {
    const auto own = run_with_queues(b, f, queues);
    for (std::size_t i = 0; i < 32; i += 2) EXPECT_NEAR(own.classes[0].start[i], 0.0, 1e-12) << queues;
    EXPECT_NEAR(own.duration, 20 * kUs, 1e-12) << queues;
  }
}

TEST(Executor, HardwareQueueHoldsLaterStreamsBehindAnOpWaitingForItsDependency) {
  // Two queues, three streams: streams a and c share queue 0. Stream a's second kernel waits (event)
  // for stream b's 50 us kernel; stream c's kernel, issued after it, waits at the head of the queue
  // behind it although nothing orders the two (head-of-line blocking), then runs at 50 us.
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  const auto a1 = b.add(c, b.kernel(5, "a1", "a"));
  const auto b1 = b.add(c, b.kernel(50, "b1", "b"));
  b.add(c, b.kernel(5, "a2", "a"), {a1, b1});
  b.add(c, b.kernel(5, "c1", "c"));
  FakeCoster f;
  f.concurrency = 1e9;
  const auto r = run_with_queues(b, f, 2);
  EXPECT_NEAR(r.classes[0].start[2], 50 * kUs, 1e-12);
  EXPECT_NEAR(r.classes[0].start[3], 50 * kUs, 1e-12);
  const auto free = run_with_queues(b, f, 3);
  EXPECT_NEAR(free.classes[0].start[3], 0.0, 1e-12);
}

TEST(Executor, ACollectiveReleasesItsHardwareQueueWhenItStarts) {
  // Two GPUs, one queue each. Each rank issues a ~200 us all-gather on stream dp, then a 10 us kernel
  // on the compute stream that does not depend on it: the kernel starts at once, beside the collective
  // (measured with PyTorch and one connection: a GEMM issued after a 3.3 ms all-reduce started within
  // 0.1 ms).
  GraphBuilder b(1, 1, 2, 1, 1, 2);
  b.class_per_rank();
  for (int c = 0; c < 2; ++c) {
    b.add(c, b.collective(Collective::all_gather, Group::dp, 20e6, "ag", "dp"));
    b.add(c, b.kernel(10, "k"));
  }
  FakeCoster f;
  f.busbw = BytesPerSecond(100e9);
  f.concurrency = 1e9;
  const auto one = run_with_queues(b, f, 1, 2);
  EXPECT_GT(one.classes[0].end[0], 50 * kUs);
  EXPECT_NEAR(one.classes[0].start[1], 0.0, 1e-12);
}

TEST(Executor, SendsAndReceivesReleaseTheirQueueWhenTheyStart) {
  // Stage 1 posts its receive (waiting 50 us for stage 0's send) and then a 10 us kernel: with one
  // queue the kernel runs while the receive waits (a pipeline's receives do not hold the queue).
  GraphBuilder b(1, 1, 1, 2, 1, 2);
  b.class_per_rank();
  const auto k0 = b.add(0, b.kernel(50, "stage0"));
  b.add(0, b.p2p(true, +1, 0, 1e6, "pp_send", "pp_send"), {k0});
  b.add(1, b.p2p(false, -1, 0, 1e6, "pp_recv", "pp_recv"));
  b.add(1, b.kernel(10, "k"));
  FakeCoster f;
  f.concurrency = 1e9;
  const auto r = run_with_queues(b, f, 1, 2);
  EXPECT_NEAR(r.classes[1].start[1], 0.0, 1e-12);
  EXPECT_GE(r.classes[1].end[0], 50 * kUs);
}

TEST(Executor, CopyStreamsAreOutsideTheKernelQueues) {
  // One kernel queue: a host-to-device copy on the copy stream, issued behind a kernel waiting 40 us
  // for its dependency, starts at once (copies go through the copy engines' own connections).
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  const auto a1 = b.add(c, b.kernel(40, "a1", "a"));
  b.add(c, b.kernel(5, "b1", "b"), {a1});
  b.add(c, copy_op(b, scenarios::CopyKind::h2d_pinned, 1e6, "host_to_device", "copy"));
  FakeCoster f;
  f.concurrency = 1e9;
  const auto r = run_with_queues(b, f, 1);
  EXPECT_NEAR(r.classes[0].start[1], 40 * kUs, 1e-12);
  EXPECT_NEAR(r.classes[0].start[2], 0.0, 1e-12);
}

TEST(Executor, ATimedOpHoldsItsHardwareQueueUntilItEnds) {
  // One queue: a 20 us kernel on stream a, then a 1 us kernel on stream b. Untimed, b starts at once
  // (a kernel releases its queue when it starts); on a recorded step the end marker behind a (a CUDA
  // event with timing) holds the queue until a ends (measured: PyTorch probe P6/P10 with one
  // connection, docs/validation/hardware_queues_h200x2_2026-11-30.md).
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  b.add(c, b.kernel(20, "a1", "a"));
  b.add(c, b.kernel(1, "b1", "b"));
  FakeCoster f;
  f.concurrency = 1e9;
  const auto untimed = run_timed(b, f, Timing::none, scenarios::Framework::cpp, 1);
  EXPECT_LT(untimed.classes[0].start[1], 1 * kUs);
  const auto timed = run_timed(b, f, Timing::every_op, scenarios::Framework::cpp, 1);
  EXPECT_GE(timed.classes[0].start[1], timed.classes[0].end[0]);
  const auto own = run_timed(b, f, Timing::every_op, scenarios::Framework::cpp, 2);  // a queue each
  EXPECT_LT(own.classes[0].start[1], timed.classes[0].end[0]);
}

TEST(Executor, OpsOfACudaGraphRunAreNotHeldInAHardwareQueue) {
  // One queue for all streams; a graph run's ops are dispatched by the graph launch, not queued
  // behind an eager op waiting for its dependency.
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  const auto a1 = b.add(c, b.kernel(40, "a1", "a"));
  b.add(c, b.kernel(5, "b1", "b"), {a1});  // eager, waits 40 us for a1 at the head of the queue
  Op g1 = b.kernel(5, "g1", "g");          // replayed in a graph
  g1.graph = 1;
  b.add(c, g1);
  b.g.graphs.push_back("attn");
  b.g.classes[0].graph_runs.push_back({2, 3, 1});
  FakeCoster f;
  f.concurrency = 1e9;
  const auto r = run_with_queues(b, f, 1);
  EXPECT_NEAR(r.classes[0].start[1], 40 * kUs, 1e-12);
  EXPECT_LT(r.classes[0].start[2], 40 * kUs);
}

TEST(Executor, HostLaneChargesTheLibraryCallLaunchOfGemmGroupedGemmAndAttention) {
  // Launch-bound (0.1 us kernels, 5-15 us launches): each op starts when its launch is done, so the
  // starts add up the launch costs of the op kinds in issue order.
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  Op gemm = b.kernel(0.1, "gemm");
  Op grouped = b.kernel(0.1, "grouped");
  grouped.kind = OpKind::grouped_gemm;
  Op attn = b.kernel(0.1, "attn");
  attn.kind = OpKind::attention;
  Op ew = b.kernel(0.1, "ew");
  ew.kind = OpKind::elementwise;
  Op attn_bwd = attn;
  attn_bwd.flags |= scenarios::kBackward;
  for (const Op& op : {gemm, grouped, attn, ew, attn_bwd}) b.add(c, op);
  FakeCoster f;
  f.host.kernel_launch = Seconds(5 * kUs);
  // No library-call costs (a profile without the families): every op costs kernel_launch.
  const auto before = run(b, f, testing::cluster(1, 1));
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(before.classes[0].start[i], 5 * kUs * static_cast<double>(i + 1), 1e-12) << i;
  }
  f.host.gemm_launch = Seconds(15 * kUs);
  f.host.grouped_gemm_launch = Seconds(12 * kUs);
  f.host.attention_launch = Seconds(9 * kUs);
  f.host.attention_bwd_launch = Seconds(20 * kUs);
  const auto after = run(b, f, testing::cluster(1, 1));
  EXPECT_NEAR(after.classes[0].start[0], 15 * kUs, 1e-12);
  EXPECT_NEAR(after.classes[0].start[1], 27 * kUs, 1e-12);
  EXPECT_NEAR(after.classes[0].start[2], 36 * kUs, 1e-12);
  EXPECT_NEAR(after.classes[0].start[3], 41 * kUs, 1e-12);
  EXPECT_NEAR(after.classes[0].start[4], 61 * kUs, 1e-12);  // backward attention: its own cost
}

// A profile with host.gemm_call prices each GEMM call by its shape (split-K: a second kernel); the
// host lane takes that price over the median constant.
TEST(Executor, HostLaneTakesTheLibraryCallCostByShapeWhenTheCosterHasIt) {
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  Op one = b.kernel(0.1, "gemm_one");
  one.shape = {16, 3072, 768, 1, 0, 0};
  Op split = b.kernel(0.1, "gemm_split");
  split.shape = {16, 768, 3072, 1, 0, 0};
  Op ew = b.kernel(0.1, "ew");
  ew.kind = OpKind::elementwise;
  for (const Op& op : {one, split, ew}) b.add(c, op);
  FakeCoster f;
  f.host.kernel_launch = Seconds(5 * kUs);
  f.host.gemm_launch = Seconds(9 * kUs);
  f.library_launch_of = [](const Op& op) -> std::optional<Seconds> {
    if (op.kind != OpKind::gemm) return std::nullopt;
    return Seconds((op.shape[2] > op.shape[1] ? 13 : 7) * kUs);
  };
  const auto r = run(b, f, testing::cluster(1, 1));
  EXPECT_NEAR(r.classes[0].start[0], 7 * kUs, 1e-12);
  EXPECT_NEAR(r.classes[0].start[1], 20 * kUs, 1e-12);
  EXPECT_NEAR(r.classes[0].start[2], 25 * kUs, 1e-12);  // not a library call: kernel_launch
}

// host.stream_cycle: when a rank's launches rotate over N streams every kernel or library launch
// costs extra(N) more on the host; a collective (an NCCL call) does not, nor a rank on one stream.
TEST(Executor, LaunchesRotatingOverStreamsPayTheStreamCycleExtra) {
  auto build = [](int streams) {
    GraphBuilder b(1, 1, 1, 1, 1, 1);
    const int c = b.add_class({0});
    for (int i = 0; i < 4; ++i) b.add(c, b.kernel(0.1, "k" + std::to_string(i), "s" + std::to_string(i % streams)));
    b.add(c, b.collective(Collective::all_reduce, Group::dp, 1024, "ar"));
    return b;
  };
  FakeCoster f;
  f.host.kernel_launch = Seconds(5 * kUs);
  f.host.collective_launch = Seconds(7 * kUs);
  f.stream_cycle_extra_of = [](int n) { return Seconds(n == 4 ? 2 * kUs : 100 * kUs); };
  const auto one = run(build(1), f, testing::cluster(1, 1));
  const auto four = run(build(4), f, testing::cluster(1, 1));
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(one.classes[0].start[i], 5 * kUs * static_cast<double>(i + 1), 1e-12) << i;
    EXPECT_NEAR(four.classes[0].start[i], 7 * kUs * static_cast<double>(i + 1), 1e-12) << i;
  }
  // The all-reduce launches after the kernels: 7 us on top, no extra (the comm stream is not counted).
  EXPECT_NEAR(four.classes[0].start[4], 28 * kUs + 7 * kUs, 1e-9);
}

// host.framework_stream_op: in a pytorch_eager step whose experts rotate over N streams, each
// per-expert launch pays the framework's extra(N) in place of host.stream_cycle's; a launch outside
// the expert loop pays neither. Without the family, host.stream_cycle applies as in a C++ run.
TEST(Executor, EagerExpertLaunchesOverStreamsPayTheFrameworkStreamExtra) {
  GraphBuilder b(1, 1, 1, 1, 1, 1);
  const int c = b.add_class({0});
  b.add(c, b.kernel(0.1, "attention"));
  for (int e = 0; e < 4; ++e) {
    Op op = b.kernel(0.1, "expert" + std::to_string(e), e % 2 == 0 ? "compute" : "expert_1");
    op.expert = e;
    b.add(c, op);
  }
  FakeCoster f;
  f.host.kernel_launch = Seconds(5 * kUs);
  f.stream_cycle_extra_of = [](int n) { return Seconds(n == 2 ? 1 * kUs : 100 * kUs); };
  f.framework_stream_extra_of = [](int n) -> std::optional<Seconds> { return Seconds(n == 2 ? 3 * kUs : 100 * kUs); };
  const auto eager = run(b, f, testing::cluster(1, 1), {}, scenarios::Framework::pytorch_eager);
  EXPECT_NEAR(eager.classes[0].start[0], 5 * kUs, 1e-12);  // not an expert's: no extra
  for (std::size_t i = 1; i < 5; ++i) {
    EXPECT_NEAR(eager.classes[0].start[i], (5 + 8 * static_cast<double>(i)) * kUs, 1e-12) << i;
  }
  const auto cpp = run(b, f, testing::cluster(1, 1));  // threewalls run's OpRunners: host.stream_cycle
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(cpp.classes[0].start[i], 6 * kUs * static_cast<double>(i + 1), 1e-12) << i;
  }
  f.framework_stream_extra_of = nullptr;  // a profile without the family
  const auto without = run(b, f, testing::cluster(1, 1), {}, scenarios::Framework::pytorch_eager);
  EXPECT_NEAR(without.classes[0].start[4], cpp.classes[0].start[4], 1e-12);
}

}  // namespace
}  // namespace threewalls::sim
