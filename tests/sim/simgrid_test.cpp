// Flow fidelity on SimGrid: closed forms, link sharing, the profile's curve, agreement with the
// analytic fidelity. SimGrid allows one engine per process: every simulation runs in a forked child.
#include <gtest/gtest.h>

#include <cmath>

#include "sim_test_support.hpp"
#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/sim/executor.hpp"
#include "threewalls/sim/simgrid_network.hpp"
#include "threewalls/sim/simulator.hpp"

namespace threewalls::sim {
namespace {

using scenarios::Collective;
using scenarios::Group;
using testing::FakeCoster;
using testing::GraphBuilder;
using testing::in_child;
using testing::pack;
using testing::unpack;

// Runs one step of `b` with flow fidelity in a child; returns the class timelines flattened as
// {duration, start/end of every op of class 0, ...}.
// flow_ranks_only: the SimGrid platform holds the ports of Executor::flow_ranks only.
std::vector<double> flow_step(const GraphBuilder& b, const OpCoster& coster, const scenarios::ClusterSpec& cl,
                              Fidelity fidelity = Fidelity::flow, bool flow_ranks_only = false) {
  return unpack(in_child([&]() {
    const Platform p(cl);
    ExecutorOptions o;
    o.fidelity = fidelity;
    const Executor ex(coster, o);
    StepResult r;
    if (fidelity == Fidelity::flow) {
      SimGridEngine engine = flow_ranks_only ? SimGridEngine(p, ex.flow_ranks(b.g)) : SimGridEngine(p);
      engine.run([&]() { r = ex.run_step(b.g, p, {}, engine.now(), &engine); });
    } else {
      r = ex.run_step(b.g, p, {}, 0.0, nullptr);
    }
    std::vector<double> out{r.duration};
    for (const auto& c : r.classes) {
      for (std::size_t i = 0; i < c.start.size(); ++i) {
        out.push_back(c.start[i]);
        out.push_back(c.end[i]);
      }
    }
    return pack(out);
  }));
}

TEST(SimGridEngine, RoutesMatchThePlatformDescription) {
  const auto out = in_child([]() {
    auto cl = testing::cluster(8, 4);
    cl.oversubscription = 2.0;
    const Platform p(cl);
    SimGridEngine e(p);
    std::string s;
    const std::pair<Endpoint, Endpoint> pairs[] = {
        {{PortKind::gpu, 1}, {PortKind::gpu, 6}},
        {{PortKind::nic, 2}, {PortKind::nic, 26}},
        {{PortKind::nic_spine, 2}, {PortKind::nic_spine, 11}},
        {{PortKind::host, 1}, {PortKind::gpu_pcie, 9}},
        {{PortKind::gpu_pcie, 9}, {PortKind::host, 1}},
    };
    for (const auto& [a, b] : pairs) {
      std::vector<std::uint32_t> ids;
      p.route(a, b, ids);
      std::vector<std::string> want;
      for (auto id : ids) want.push_back(p.link_name(id));
      const auto got = e.route_names(a, b);
      if (got != want) {
        s += "mismatch:";
        for (const auto& n : got) s += " " + n;
        s += " vs";
        for (const auto& n : want) s += " " + n;
        s += "\n";
      }
    }
    return s.empty() ? std::string("ok") : s;
  });
  EXPECT_EQ(out, "ok");
}

TEST(SimGridEngine, RingAllReduceOnNGpusTakesItsClosedForm) {
  // 2(n-1)/n S / B plus the latency term, inside a node (NVLink) and across 4 nodes (one GPU each
  // on the same rail), with every rank simulated and with one representative for all.
  struct Case {
    int n, gpn, nodes;
    double link;
    bool one_class;
  };
  for (const Case& c : {Case{8, 8, 1, 450e9, false}, Case{8, 8, 1, 450e9, true}, Case{4, 1, 4, 50e9, false}}) {
    const double S = 512e6;
    GraphBuilder b(c.n, 1, 1, 1, 1, c.gpn);
    if (c.one_class) {
      std::vector<int> all;
      for (int r = 0; r < c.n; ++r) all.push_back(r);
      b.add_class(all);
    } else {
      b.class_per_rank();
    }
    for (std::size_t k = 0; k < b.g.classes.size(); ++k) {
      b.add(static_cast<int>(k), b.collective(Collective::all_reduce, Group::tp, S, "ar"));
    }
    FakeCoster f;
    f.alpha = microseconds(2.0 * (c.n - 1) * 1.5);
    f.busbw = BytesPerSecond(c.link);
    ExecutorOptions o;
    auto cl = testing::cluster(c.gpn, c.nodes, 450, 50);
    const auto r = flow_step(b, f, cl);
    const double expect = f.alpha.value + 2.0 * (c.n - 1) / c.n * S / c.link;
    EXPECT_NEAR(r[0], expect, 1e-6 * expect) << "n " << c.n << " nodes " << c.nodes << " one class " << c.one_class;
  }
}

TEST(SimGridEngine, TwoFlowsOnOneLinkShareIt) {
  // Stage 0 of a 3-stage pipeline on one node sends S to stage 1 and S to stage 2 at once: both
  // flows leave through its NVLink port and take 2 S / B; analytic fidelity (no sharing) says S / B.
  const double S = 450e6;
  GraphBuilder b(1, 1, 1, 3, 1, 3);
  b.class_per_rank();
  b.add(0, b.p2p(true, +1, 0, S, "send_next", "a"));
  b.add(0, b.p2p(true, -1, 0, S, "send_prev", "b"));
  b.add(1, b.p2p(false, -1, 0, S, "recv", "a"));
  b.add(2, b.p2p(false, +1, 0, S, "recv", "b"));
  FakeCoster f;
  f.busbw = BytesPerSecond(450e9);
  const auto cl = testing::cluster(3, 1, 450, 50);
  const auto flow = flow_step(b, f, cl);
  EXPECT_NEAR(flow[0], 2.0 * S / 450e9, 1e-6 * 2.0 * S / 450e9);
  const auto analytic = flow_step(b, f, cl, Fidelity::analytic);
  EXPECT_NEAR(analytic[0], S / 450e9, 1e-9);
}

TEST(SimGridEngine, ExpertAndDataParallelTrafficContendForTheNic) {
  // 2 nodes x 8 GPUs, TP 8 inside a node, DP 2 across (rank 0 with rank 8), EP 16 over all: an
  // all-to-all and a data-parallel all-reduce at once both leave through NIC 0. Analytic fidelity
  // runs each as if alone; flow fidelity shares the NIC and takes about twice as long.
  GraphBuilder b(8, 1, 2, 1, 16, 8);
  std::vector<int> all;
  for (int r = 0; r < 16; ++r) all.push_back(r);
  const int c = b.add_class(all);
  b.add(c, b.collective(Collective::all_to_all, Group::ep, 800e6, "a2a", "ep"));
  b.add(c, b.collective(Collective::all_reduce, Group::dp, 800e6, "ar", "dp"));
  FakeCoster f;
  f.busbw = BytesPerSecond(45e9);
  const auto cl = testing::cluster(8, 2, 450, 50);
  const auto flow = flow_step(b, f, cl);
  const auto analytic = flow_step(b, f, cl, Fidelity::analytic);
  EXPECT_GT(flow[0], 1.5 * analytic[0]);
  // Alone, each matches the analytic time.
  GraphBuilder one(8, 1, 2, 1, 16, 8);
  const int k = one.add_class(all);
  one.add(k, one.collective(Collective::all_reduce, Group::dp, 800e6, "ar", "dp"));
  EXPECT_NEAR(flow_step(one, f, cl)[0], flow_step(one, f, cl, Fidelity::analytic)[0], 1e-6 * 800e6 / 45e9);
}

TEST(SimGridEngine, APlatformOfTheFlowRanksOnlyGivesTheSameTimes) {
  // 2 nodes x 8 GPUs, one class for all (representative rank 0): a ring all-reduce inside the node
  // reaches rank 1 only, the data-parallel one rank 8, the all-to-all over the 16 every rank.
  std::vector<int> all;
  for (int r = 0; r < 16; ++r) all.push_back(r);
  GraphBuilder ring(8, 1, 2, 1, 16, 8);
  const int c = ring.add_class(all);
  ring.add(c, ring.collective(Collective::all_reduce, Group::tp, 800e6, "ar_tp", "tp"));
  ring.add(c, ring.collective(Collective::all_reduce, Group::dp, 800e6, "ar_dp", "dp"));
  FakeCoster f;
  f.busbw = BytesPerSecond(45e9);
  const Executor ex(f, ExecutorOptions{});
  EXPECT_EQ(ex.flow_ranks(ring.g), (std::vector<int>{0, 1, 8}));
  GraphBuilder a2a = ring;
  a2a.add(c, a2a.collective(Collective::all_to_all, Group::ep, 800e6, "a2a", "ep"));
  EXPECT_EQ(ex.flow_ranks(a2a.g), all);
  const auto cl = testing::cluster(8, 2, 450, 50);
  for (const GraphBuilder* b : {&ring, &a2a}) {
    EXPECT_EQ(flow_step(*b, f, cl, Fidelity::flow, true), flow_step(*b, f, cl, Fidelity::flow, false));
  }
}

TEST(SimGridEngine, AFlowOutsideThePlatformsRanksIsALogicError) {
  const auto out = in_child([]() {
    const Platform p(testing::cluster(4, 1));
    SimGridEngine engine(p, {1, 0});
    std::string s;
    // A link of a rank left out: nothing can use it, nothing to change.
    engine.set_link_bandwidth(p.link_id(LinkKind::nvlink_up, 3), BytesPerSecond(1e9));
    engine.run([&]() {
      std::vector<std::uint32_t> links;
      p.route({PortKind::gpu, 0}, {PortKind::gpu, 1}, links);
      const PlacedFlow inside{{PortKind::gpu, 0}, {PortKind::gpu, 1}, 1e6, links};
      engine.start_group(1, std::span<const PlacedFlow>(&inside, 1));
      std::vector<std::uint64_t> done;
      while (done.empty()) engine.advance(1.0, done);
      s += "inside ok;";
      links.clear();
      p.route({PortKind::gpu, 0}, {PortKind::gpu, 2}, links);
      const PlacedFlow outside{{PortKind::gpu, 0}, {PortKind::gpu, 2}, 1e6, links};
      try {
        engine.start_group(2, std::span<const PlacedFlow>(&outside, 1));
        s += " outside started";
      } catch (const std::logic_error& e) {
        s += std::string(" logic error: ") + e.what();
      }
    });
    return s;
  });
  EXPECT_EQ(out.rfind("inside ok; logic error: ", 0), 0U) << out;
  EXPECT_NE(out.find("not built for"), std::string::npos) << out;
}

TEST(SimGridEngine, LoneCollectiveReproducesTheProfilesCurve) {
  // With the shipped H100 profile, a collective alone takes exactly CostModel::collective() for its
  // size and group size, inside a node and across nodes (a multi-node all-to-all: its analytic split).
  const auto profile = calibration::Profile::load(testing::source_dir() / "calibration/profiles/default_h100.toml");
  const calibration::CostModel model(profile);
  const CostModelCoster coster(model);
  struct Case {
    Collective kind;
    int n, gpn, nodes;
    Group group;
  };
  const Case cases[] = {
      {Collective::all_reduce, 8, 8, 1, Group::tp},      {Collective::all_gather, 8, 8, 1, Group::tp},
      {Collective::all_to_all, 8, 8, 1, Group::tp},      {Collective::all_to_all, 16, 8, 2, Group::tp},
      {Collective::reduce_scatter, 16, 8, 2, Group::tp},
  };
  for (const Case& c : cases) {
    for (double S : {1e6, 64e6, 1e9}) {
      GraphBuilder b(c.n, 1, 1, 1, 1, c.gpn);
      std::vector<int> all;
      for (int r = 0; r < c.n; ++r) all.push_back(r);
      const int k = b.add_class(all);
      b.add(k, b.collective(c.kind, c.group, S, "coll"));
      auto cl = testing::cluster(c.gpn, c.nodes, 450, 50);
      const auto r = flow_step(b, coster, cl);
      // A multi-node all-to-all is dispatched hierarchically (the bytes to peers inside the node on
      // NVLink, the rest on the network), and a multi-node ring with 8 GPUs per node runs one channel
      // per NIC (docs/simulator.md, "Rings across nodes"): flow fidelity matches the analytic time of
      // that split, not one curve.
      const bool split = c.nodes > 1;
      const auto a = split ? flow_step(b, coster, cl, Fidelity::analytic) : r;
      const double want =
          split ? a[2] - a[1]
                : model.collective(c.kind, Bytes(S), c.n, c.nodes > 1 ? LinkScope::network : LinkScope::nvlink).value;
      // The op's own duration (the step also holds its host launch).
      EXPECT_NEAR(r[2] - r[1], want, 1e-6 * want) << scenarios::to_string(c.kind) << " n " << c.n << " S " << S;
      if (split && c.kind != Collective::all_to_all) {
        // The ring's closed form: latency + max(f S / 8 / busbw(network, n), f S 7/8 / busbw(nvlink, 8)).
        const auto net = model.collective_params(c.kind, Bytes(S), c.n, LinkScope::network);
        const auto nv = model.collective_params(c.kind, Bytes(S), c.gpn, LinkScope::nvlink);
        const double traffic = bus_factor(c.kind, c.n) * S;
        const double ring = net.latency.value + std::max(traffic / 8.0 / net.bus_bandwidth.value,
                                                         traffic * 7.0 / 8.0 / nv.bus_bandwidth.value);
        EXPECT_NEAR(want, ring, 1e-9 * ring) << scenarios::to_string(c.kind) << " S " << S;
      }
    }
  }
}

TEST(SimGridEngine, ADeadlockInFlowFidelityIsAnInputErrorNotACrash) {
  // A send whose receive never comes, while a flow of another op is in flight: the error leaves the
  // SimGrid actor as an exception once the flow has completed.
  const auto out = in_child([]() {
    GraphBuilder b(1, 1, 1, 2, 1, 2);
    b.class_per_rank();
    b.add(0, b.p2p(true, +1, 1, 1e6, "send_fwd", "a"));
    b.add(0, b.p2p(true, +1, 2, 1e9, "send_fwd", "b"));
    b.add(1, b.p2p(false, -1, 2, 1e9, "recv_fwd", "b"));
    const FakeCoster f;
    const Platform p(testing::cluster(2, 1));
    SimGridEngine engine(p);
    const Executor ex(f, ExecutorOptions{});
    try {
      engine.run([&]() { ex.run_step(b.g, p, {}, engine.now(), &engine); });
    } catch (const InputError& e) {
      return std::string("input error: ") + e.what();
    }
    return std::string("no error");
  });
  EXPECT_EQ(out.rfind("input error", 0), 0U) << out;
  EXPECT_NE(out.find("deadlock"), std::string::npos) << out;
  EXPECT_NE(out.find("tag 1"), std::string::npos) << out;
}

TEST(SimGridEngine, ASecondEngineInOneProcessIsASystemError) {
  const auto out = in_child([]() {
    const Platform p(testing::cluster(2, 1));
    SimGridEngine first(p);
    try {
      SimGridEngine second(p);
    } catch (const SystemError& e) {
      return std::string("system error: ") + e.what();
    }
    return std::string("no error");
  });
  EXPECT_EQ(out.rfind("system error", 0), 0U) << out;
}

// Step time of an example scenario with both fidelities.
std::pair<double, double> both_fidelities(const char* file, int steps) {
  const auto s = scenarios::load_scenario(testing::source_dir() / "scenarios/examples" / file);
  auto step_time = [&](Fidelity f) {
    return unpack(in_child([&]() {
      SimOptions o;
      o.fidelity = f;
      o.steps = steps;
      const auto r = simulate(s, "", o);
      return pack({r.summary.step_time_us.median});
    }))[0];
  };
  return {step_time(Fidelity::flow), step_time(Fidelity::analytic)};
}

// threewalls sim --host-scale: a launch-bound step grows with a slower host, a device-bound
// one hardly moves, and the host wall carries the difference.
TEST(SimHostScale, MovesLaunchBoundStepsAndTheHostWallNotDeviceBoundOnes) {
  auto run = [](const char* file, double scale) {
    const auto s = scenarios::load_scenario(testing::source_dir() / "scenarios/validation/host_overhead" / file);
    return unpack(in_child([&]() {
      SimOptions o;
      o.steps = 2;
      o.host_scale = scale;
      const auto r = simulate(s, (testing::source_dir() / "calibration/profiles/h100.toml").string(), o);
      return pack({r.summary.step_time_us.median, r.summary.walls_mean ? r.summary.walls_mean->host_us : -1.0});
    }));
  };
  const auto launch_1 = run("switch_d768_t1k_sequential_none.toml", 1.0);
  const auto launch_2 = run("switch_d768_t1k_sequential_none.toml", 1.5);
  EXPECT_GT(launch_2[0], 1.3 * launch_1[0]);
  EXPECT_GT(launch_2[1], launch_1[1] + 0.5 * (launch_2[0] - launch_1[0]));
  const auto device_1 = run("switch_d1024_t16k_grouped_none.toml", 1.0);
  const auto device_2 = run("switch_d1024_t16k_grouped_none.toml", 1.5);
  EXPECT_LT(device_2[0], 1.05 * device_1[0]);
}

TEST(SimGridEngine, FlowAndAnalyticFidelityAgreeWithinFivePercentWithoutContention) {
  // Scenarios whose collectives do not overlap on shared links.
  for (const char* f : {"small_moe_1gpu.toml", "small_moe_ep2.toml", "small_moe_ep4.toml", "small_moe_tp2_ep2.toml"}) {
    const auto [flow, analytic] = both_fidelities(f, 1);
    EXPECT_NEAR(flow, analytic, 0.05 * analytic) << f;
  }
}

}  // namespace
}  // namespace threewalls::sim
