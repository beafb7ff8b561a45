#pragma once
// Helpers of the sim tests: a fake coster with closed-form costs, a builder of hand-made StepGraphs,
// clusters, and running a SimGrid simulation in a child process (SimGrid: one engine per process).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "threewalls/scenarios/layout.hpp"
#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/scenarios/step_graph.hpp"
#include "threewalls/sim/op_coster.hpp"

namespace threewalls::sim::testing {

using scenarios::Collective;
using scenarios::Group;
using scenarios::HostKind;
using scenarios::Op;
using scenarios::OpKind;
using scenarios::StepGraph;
using scenarios::StreamKind;

inline std::filesystem::path source_dir() { return std::filesystem::path(THREEWALLS_SOURCE_DIR); }

// Costs in closed form. A kernel's device time is its `flops` field read as microseconds (the
// tests' convention); a collective has latency `alpha` and bus bandwidth `busbw`; copies run at
// `copy_bw`; host costs and stream concurrency are settable.
class FakeCoster final : public OpCoster {
 public:
  Seconds alpha{0.0};
  BytesPerSecond busbw{450e9};
  BytesPerSecond copy_bw{50e9};
  HostCosts host{};
  double concurrency = 1.0;  // throughput of 2+ concurrent kernels relative to back to back
  // Host time of a GEMM's library call by shape (empty: none, the HostCosts constant applies).
  std::function<std::optional<Seconds>(const Op&)> library_launch_of;
  // Extra host time per launch rotating over N streams (host.stream_cycle); 0 by default.
  std::function<Seconds(int)> stream_cycle_extra_of;
  // The same for an eager framework's expert loop (host.framework_stream_op); empty by default.
  std::function<std::optional<Seconds>(int)> framework_stream_extra_of;
  // RDMA bandwidth of a flex dispatch (dispatch.flex.network); empty by default: the network curve.
  std::optional<BytesPerSecond> expert_dispatch_bw;

  [[nodiscard]] Seconds kernel_time(const Op& op) const override { return Seconds(op.flops * 1e-6); }
  [[nodiscard]] Seconds copy_time(scenarios::CopyKind, Bytes bytes) const override { return bytes / copy_bw; }
  [[nodiscard]] CommParams comm_params(Collective, Bytes, int, LinkScope) const override { return {alpha, busbw}; }
  [[nodiscard]] HostCosts host_costs() const override { return host; }
  [[nodiscard]] double stream_concurrency(int streams, double) const override { return streams <= 1 ? 1.0 : concurrency; }
  [[nodiscard]] int sm_count() const override { return 132; }
  [[nodiscard]] Seconds stream_cycle_extra(int streams) const override {
    return stream_cycle_extra_of ? stream_cycle_extra_of(streams) : Seconds(0.0);
  }
  [[nodiscard]] std::optional<Seconds> framework_stream_extra(int streams) const override {
    return framework_stream_extra_of ? framework_stream_extra_of(streams) : std::nullopt;
  }
  [[nodiscard]] std::optional<Seconds> library_launch(const Op& op) const override {
    return library_launch_of ? library_launch_of(op) : std::nullopt;
  }
  [[nodiscard]] std::optional<BytesPerSecond> expert_dispatch_bandwidth(int, bool) const override {
    return expert_dispatch_bw;
  }
};

// A cluster of `nodes` x `gpn` GPUs with NVLink `nvlink` GB/s, NIC `nic` GB/s, zero latencies.
inline scenarios::ClusterSpec cluster(int gpn, int nodes, double nvlink_gbps = 450, double nic_gbps = 50) {
  scenarios::ClusterSpec c;
  c.gpu = scenarios::GpuKind::h100;
  c.gpus_per_node = gpn;
  c.nodes = nodes;
  c.gpu_memory = Bytes(80e9);
  c.nvlink_bandwidth = BytesPerSecond(nvlink_gbps * 1e9);
  c.pcie_bandwidth = BytesPerSecond(64e9);
  c.nic_bandwidth = BytesPerSecond(nic_gbps * 1e9);
  c.topology = scenarios::Topology::rail_optimized;
  c.leaf_switch_ports = 64;
  c.oversubscription = 1.0;
  return c;
}

// Hand-made StepGraphs: a layout, streams and phases by name, classes of ranks, ops with deps.
class GraphBuilder {
 public:
  GraphBuilder(int tp, int cp, int dp, int pp, int ep, int gpus_per_node) {
    const int world = tp * cp * dp * pp;
    g.layout = scenarios::Layout(tp, cp, dp, pp, 1, ep, world / (ep * pp), gpus_per_node);
    g.class_of_rank.assign(static_cast<std::size_t>(world), -1);
    g.step_kind = "train";
  }

  std::uint8_t stream(const std::string& name, StreamKind kind = StreamKind::compute) {
    for (std::size_t i = 0; i < g.streams.size(); ++i) {
      if (g.streams[i].name == name) return static_cast<std::uint8_t>(i);
    }
    g.streams.push_back({name, kind});
    return static_cast<std::uint8_t>(g.streams.size() - 1);
  }
  std::uint16_t phase(const std::string& name) {
    for (std::size_t i = 0; i < g.phases.size(); ++i) {
      if (g.phases[i] == name) return static_cast<std::uint16_t>(i);
    }
    g.phases.push_back(name);
    return static_cast<std::uint16_t>(g.phases.size() - 1);
  }
  // A class of `ranks` at pipeline stage `stage`; returns its index.
  int add_class(const std::vector<int>& ranks, int stage = 0) {
    scenarios::RankClass rc;
    rc.id = static_cast<int>(g.classes.size());
    rc.pp_stage = stage;
    rc.label = "class " + std::to_string(rc.id);
    rc.ranks = ranks;
    for (int r : ranks) g.class_of_rank.at(static_cast<std::size_t>(r)) = rc.id;
    g.classes.push_back(std::move(rc));
    return static_cast<int>(g.classes.size() - 1);
  }
  // One class per rank, stage from the layout.
  void class_per_rank() {
    for (int r = 0; r < g.layout.world(); ++r) add_class({r}, g.layout.stage_of(r));
  }
  std::uint32_t add(int cls, Op op, std::initializer_list<std::uint32_t> deps = {}) {
    auto& rc = g.classes.at(static_cast<std::size_t>(cls));
    op.deps_begin = static_cast<std::uint32_t>(rc.deps.size());
    for (std::uint32_t d : deps) rc.deps.push_back(d);
    op.deps_end = static_cast<std::uint32_t>(rc.deps.size());
    rc.ops.push_back(op);
    return static_cast<std::uint32_t>(rc.ops.size() - 1);
  }

  // A compute kernel of `us` microseconds.
  Op kernel(double us, const std::string& ph, const std::string& st = "compute", int mb = -1) {
    Op op;
    op.kind = OpKind::gemm;
    op.wall = scenarios::Wall::compute;
    op.flops = us;
    op.phase = phase(ph);
    op.stream = stream(st);
    op.microbatch = static_cast<std::int32_t>(mb);
    return op;
  }
  Op collective(Collective c, Group grp, double bytes, const std::string& ph, const std::string& st = "comm") {
    Op op;
    op.kind = OpKind::collective;
    op.sub = static_cast<std::uint8_t>(c);
    op.wall = scenarios::Wall::communication;
    op.group = grp;
    op.group_size = static_cast<std::int32_t>(g.layout.group_size(grp));
    op.bytes = bytes;
    op.shape = {static_cast<std::int64_t>(bytes), 0, 0, 0, 0, 0};
    op.phase = phase(ph);
    op.stream = stream(st, StreamKind::communication);
    return op;
  }
  Op p2p(bool send, int peer, int tag, double bytes, const std::string& ph, const std::string& st, int mb = -1) {
    Op op;
    op.kind = send ? OpKind::send : OpKind::recv;
    op.wall = scenarios::Wall::communication;
    op.group = Group::pp;
    op.group_size = static_cast<std::int32_t>(g.layout.group_size(Group::pp));
    op.peer = static_cast<std::int8_t>(peer);
    op.tag = tag;
    op.bytes = bytes;
    op.phase = phase(ph);
    op.stream = stream(st, StreamKind::communication);
    op.microbatch = static_cast<std::int32_t>(mb);
    return op;
  }
  Op host(HostKind k, const std::string& ph) {
    Op op;
    op.kind = OpKind::host;
    op.sub = static_cast<std::uint8_t>(k);
    op.wall = scenarios::Wall::host;
    op.phase = phase(ph);
    op.stream = stream("host", StreamKind::host);
    return op;
  }

  StepGraph g;
};

// Runs `fn` in a forked child and returns what it returned. A child that throws or dies makes the
// result start with "CHILD FAILED:".
inline std::string in_child(const std::function<std::string()>& fn) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    close(fds[0]);
    std::string out;
    int rc = 0;
    try {
      out = fn();
    } catch (const std::exception& e) {
      out = std::string("CHILD FAILED: exception: ") + e.what();
      rc = 1;
    } catch (...) {
      out = "CHILD FAILED: unknown exception";
      rc = 1;
    }
    std::size_t off = 0;
    while (off < out.size()) {
      const ssize_t n = write(fds[1], out.data() + off, out.size() - off);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
    close(fds[1]);
    _exit(rc);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n = 0;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) return "CHILD FAILED: killed by signal " + std::to_string(WTERMSIG(status)) + "; output: " + out;
  if (WEXITSTATUS(status) != 0 && out.rfind("CHILD FAILED", 0) != 0) return "CHILD FAILED: exit " + std::to_string(WEXITSTATUS(status)) + ": " + out;
  return out;
}

// Doubles through the child pipe.
inline std::string pack(const std::vector<double>& v) {
  std::string s(v.size() * sizeof(double), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
  return s;
}
inline std::vector<double> unpack(const std::string& s) {
  if (s.rfind("CHILD FAILED", 0) == 0) throw std::runtime_error(s);
  std::vector<double> v(s.size() / sizeof(double));
  if (!v.empty()) std::memcpy(v.data(), s.data(), v.size() * sizeof(double));
  return v;
}

}  // namespace threewalls::sim::testing
