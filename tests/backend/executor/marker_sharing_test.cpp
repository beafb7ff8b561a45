// Shared boundary markers (docs/profiler.md, "Shared boundary markers"): on a recorded step, an op
// issued right behind a timed op on its stream starts at that op's end marker. The recorder's
// ownership of shared markers (released once), the executor's marker count per recorded step on the
// fake device against the rule written out independently here, and the records against the fake
// device's own timeline with and without sharing.
#include <gtest/gtest.h>

#include <cstdio>
#include <chrono>
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
#include "threewalls/profiler/step_recorder.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/step_graph.hpp"
#include "placement.hpp"

namespace threewalls::backend {
namespace {

namespace fs = std::filesystem;
using scenarios::Op;
using scenarios::OpKind;
using scenarios::RankClass;
using scenarios::Scenario;
using scenarios::StepGraph;

// ---------------------------------------------------------------------------------------------
// StepRecorder: ownership of shared markers
// ---------------------------------------------------------------------------------------------

// Markers whose time the test sets; a release of a marker that is not live (twice, or never
// recorded) is a test failure.
struct StrictClock {
  using Stream = int;
  struct Marker {
    int id = -1;
    friend bool operator==(Marker a, Marker b) { return a.id == b.id; }
  };
  std::map<int, double> time;
  std::set<int> live;
  int next = 0;
  int bad_releases = 0;
  Marker mark(int /*s*/) {
    live.insert(next);
    return Marker{next++};
  }
  bool done(Marker m) { return m.id < 0 || time.count(m.id) != 0; }
  double elapsed_us(Marker a, Marker b) { return time.at(b.id) - time.at(a.id); }
  void release(Marker m) {
    if (m.id < 0) return;
    if (live.erase(m.id) == 0) ++bad_releases;
  }
};

profiler::SamplingPolicy every_step() {
  profiler::SamplingConfig c;
  c.record_every_n_steps = 1;
  c.flush_every_n_steps = 1;
  return profiler::SamplingPolicy(c, 1);
}

using Rec = profiler::StepRecorder<StrictClock>;

TEST(StepRecorder, ASharedStartMarkerGivesTheSameRecordsAndIsReleasedOnce) {
  StrictClock clock;
  Rec rec(clock, every_step(), 0, nullptr);
  const auto anchor = clock.mark(0);
  clock.time[anchor.id] = 0.0;
  rec.set_anchor(anchor, 100.0);
  profiler::PhaseRecord tmpl;
  const int epoch = clock.next;
  rec.begin_step(0, 0);
  // Three back-to-back ops on one stream: 4 markers (a, b, c, d), not 6.
  const auto a = clock.mark(0);
  const auto b = clock.mark(0);
  rec.device_phase(tmpl, a, b);
  const auto c = clock.mark(0);
  rec.device_phase(tmpl, b, c, Rec::Owns::end);
  const auto d = clock.mark(0);
  rec.device_phase(tmpl, c, d, Rec::Owns::end);
  const auto z = clock.mark(0);
  rec.end_step(z);
  clock.time[epoch] = 10.0;
  clock.time[a.id] = 11.0;
  clock.time[b.id] = 15.0;
  clock.time[c.id] = 22.0;
  clock.time[d.id] = 30.0;
  clock.time[z.id] = 31.0;
  ASSERT_EQ(rec.harvest(), 1U);
  ASSERT_EQ(rec.kept_phases().size(), 3U);
  const double want[3][2] = {{1.0, 4.0}, {5.0, 7.0}, {12.0, 8.0}};
  for (int k = 0; k < 3; ++k) {
    EXPECT_DOUBLE_EQ(rec.kept_phases()[static_cast<std::size_t>(k)].start_us, want[k][0]) << k;
    EXPECT_DOUBLE_EQ(rec.kept_phases()[static_cast<std::size_t>(k)].dur_us, want[k][1]) << k;
  }
  EXPECT_EQ(clock.bad_releases, 0) << "a shared marker was released twice";
  EXPECT_EQ(clock.live, (std::set<int>{epoch})) << "every marker but the new anchor went back, once";
}

TEST(StepRecorder, GroupMembersSharingBothMarkersAreReleasedOnceEvenOnAbort) {
  StrictClock clock;
  Rec rec(clock, every_step(), 0, nullptr);
  profiler::PhaseRecord tmpl;
  rec.begin_step(0, 0);
  const auto a = clock.mark(0);
  const auto b = clock.mark(0);
  rec.device_phase(tmpl, a, b);
  // A group of three members, its start shared with the op before, its end with each other.
  const auto g = clock.mark(0);
  rec.device_phase(tmpl, b, g, Rec::Owns::end);
  rec.device_phase(tmpl, b, g, Rec::Owns::none);
  rec.device_phase(tmpl, b, g, Rec::Owns::none);
  rec.end_step(clock.mark(0));
  // Nothing finished: an aborted run returns every marker of the pending step.
  rec.release_all();
  EXPECT_EQ(clock.bad_releases, 0);
  EXPECT_TRUE(clock.live.empty()) << clock.live.size() << " markers leaked";
}

// ---------------------------------------------------------------------------------------------
// The fake device refuses a double release
// ---------------------------------------------------------------------------------------------

Scenario scenario_from(const std::string& text) { return scenarios::load_scenario_text(text, "markers_test.toml").scenario; }

// A small MoE (a step is a few milliseconds on the fake device).
std::string small_moe(const std::string& parallel, const std::string& train_extra, int gpus,
                      const std::string& model_extra = "") {
  return "schema_version = 1\nname = \"markers_test\"\n[model]\nnum_layers = 2\nhidden_size = 256\n"
         "num_attention_heads = 4\nvocab_size = 1024\nnum_experts = 4\nmoe_ffn_hidden_size = 256\n"
         "moe_router_topk = 2\n" +
         model_extra + "\n[parallel]\n" + parallel + "\n[train]\nmicro_batch_size = 1\nglobal_batch_size = " +
         std::to_string(2 * gpus) + "\nseq_length = 256\n" + train_extra +
         "\n[cluster]\ngpu = \"h100\"\ngpus_per_node = " + std::to_string(gpus) +
         "\nnodes = 1\n[run]\nsteps = 2\nwarmup_steps = 1\n[run.profiler]\nrecord_every_n_steps = 1\n";
}

TEST(FakeDevice, ReleasingAMarkerTwiceThrows) {
  const Scenario s = scenario_from(small_moe("tp = 1", "", 1));
  const StepGraph g = scenarios::expand(s, 0);
  FakeFabric fabric;
  FakeDevice dev(fabric, 0);
  DeviceSetup setup;
  setup.rank = 0;
  setup.world_size = 1;
  setup.graph = &g;
  setup.streams = {0};
  dev.open(setup, g.class_of(0));
  const std::uint32_t m = dev.record_marker(0);
  EXPECT_EQ(fabric.markers_recorded(), 1U);
  dev.release_marker(m);
  try {
    dev.release_marker(m);
    ADD_FAILURE() << "a second release was accepted";
  } catch (const SystemError& e) {
    EXPECT_NE(std::string(e.what()).find("released twice"), std::string::npos) << e.what();
  }
  // Reused from the pool, it may be released again (once).
  const std::uint32_t again = dev.record_marker(0);
  while (!dev.marker_done(again)) {
  }
  dev.release_marker(again);
}

// ---------------------------------------------------------------------------------------------
// Executor: markers per recorded step
// ---------------------------------------------------------------------------------------------

bool is_disk_read(const Op& op) { return op.kind == OpKind::copy && op.copy_kind() == scenarios::CopyKind::disk_read; }

// The sharing rule of docs/profiler.md written out over the StepGraph (graph runs and send/recv
// groups excluded: the scenarios below have neither): the timing markers one recorded step of rank
// class `rc` records on the streams, every op timed (granularity "layer"). `waits_break`: whether a
// cross-stream wait ends the sharing (false: the count a wrong implementation would reach).
std::size_t markers_per_step(const RankClass& rc, bool share, bool waits_break = true) {
  const std::size_t n = rc.ops.size();
  std::vector<bool> needs_event(n, false);
  for (std::uint32_t j = 0; j < n; ++j) {
    const Op& op = rc.ops[j];
    for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
      const std::uint32_t dep = rc.deps_of(op)[d];
      const Op& o = rc.ops[dep];
      if (o.kind == OpKind::host || is_disk_read(o)) continue;
      if (op.kind == OpKind::host || is_disk_read(op) || o.stream != op.stream) needs_event[dep] = true;
    }
  }
  std::size_t markers = 2;  // the step's epoch and end
  std::map<int, bool> open;  // stream -> its last enqueued item is a shareable end marker
  for (std::uint32_t i = 0; i < n; ++i) {
    const Op& op = rc.ops[i];
    if (op.kind == OpKind::host || is_disk_read(op)) {
      open.clear();
      if (op.kind == OpKind::host) {  // a marker behind its deps on each of their streams
        std::set<int> streams;
        for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
          const Op& o = rc.ops[rc.deps_of(op)[d]];
          if (o.kind != OpKind::host && !is_disk_read(o)) streams.insert(o.stream);
        }
        markers += streams.size();
      }
      continue;
    }
    bool waits = false;
    for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
      const Op& o = rc.ops[rc.deps_of(op)[d]];
      if (o.kind != OpKind::host && !is_disk_read(o) && o.stream != op.stream) waits = true;
    }
    const bool shares = share && open[op.stream] && !(waits && waits_break);
    markers += shares ? 1 : 2;
    open[op.stream] = !needs_event[i];
  }
  return markers;
}

struct Counted {
  std::size_t markers = 0;
  std::vector<FakeTraceEntry> trace;
  profiler::RunData data;
};

// A fake device whose host is always behind: every query of a marker waits until the stream has
// reached it, so the stream is idle whenever the next op is issued (a launch-bound loop).
class HostBehindDevice : public FakeDevice {
 public:
  using FakeDevice::FakeDevice;
  bool marker_done(std::uint32_t marker) override {
    while (!FakeDevice::marker_done(marker)) std::this_thread::sleep_for(std::chrono::microseconds(20));
    return true;
  }
};

// Ops long enough (1.5 ms) that the host issues the next op well before the stream reaches the
// previous op's end marker, as in a device-bound step.
FakeDeviceOptions device_behind() {
  FakeDeviceOptions fo;
  fo.min_op_us = 1500.0;
  return fo;
}

Counted run_counted(const Scenario& s, bool share, int steps, FakeDeviceOptions fo = {}, bool host_behind = false) {
  const fs::path dir = fs::temp_directory_path() /
                       ("tw_markers_" + std::to_string(::getpid()) + (share ? "_shared" : "_unshared"));
  fs::remove_all(dir);
  fo.flops_per_us = 2e7;
  fo.bytes_per_us = 2e5;
  fo.link_bytes_per_us = 1e5;
  fo.min_op_us = std::max(fo.min_op_us, 2.0);
  fo.max_op_us = std::max(fo.min_op_us, 600.0);
  FakeFabric fabric(fo);
  ProcessContext pc;
  for (int r = 0; r < s.world_size(); ++r) pc.local_ranks.push_back(r);
  pc.make_comm_ids = [&fabric](std::size_t n) { return fabric.make_ids(n); };
  pc.host_now_us = [&fabric] { return fabric.now_us(); };
  const DeviceFactory factory = [&fabric, host_behind](int rank, int) -> std::unique_ptr<Device> {
    if (host_behind) return std::make_unique<HostBehindDevice>(fabric, rank);
    return std::make_unique<FakeDevice>(fabric, rank);
  };
  ExecutorOptions eo;
  eo.out_dir = dir;
  eo.steps = steps;
  eo.warmup_steps = 1;
  eo.timeout = std::chrono::seconds(20);
  eo.realign_every_s = 1e9;  // one anchor marker per rank (at the first measured step), no re-alignment
  eo.share_timing_markers = share;
  execute(s, pc, factory, eo);
  Counted out;
  out.markers = fabric.markers_recorded();
  out.trace = fabric.trace();
  out.data = profiler::RunDirReader::read(dir);
  fs::remove_all(dir);
  return out;
}

std::size_t expected_markers(const Scenario& s, const StepGraph& g, bool share, int steps, bool waits_break = true) {
  std::size_t total = 0;
  for (int r = 0; r < s.world_size(); ++r) {
    total += 1 + static_cast<std::size_t>(steps) * markers_per_step(g.class_of(r), share, waits_break);
  }
  return total;
}

std::size_t device_ops(const RankClass& rc) {
  std::size_t n = 0;
  for (const Op& op : rc.ops) n += op.kind != OpKind::host && !is_disk_read(op) ? 1 : 0;
  return n;
}

TEST(Executor, BackToBackTimedOpsOnOneStreamShareTheirBoundaryMarkers) {
  const Scenario s = scenario_from(small_moe("tp = 1", "", 1));
  const StepGraph g = scenarios::expand(s, 0);
  ASSERT_TRUE(g.class_of(0).graph_runs.empty());
  const int steps = 2;
  const Counted shared = run_counted(s, true, steps, device_behind());
  const Counted unshared = run_counted(s, false, steps, device_behind());
  EXPECT_EQ(unshared.markers, expected_markers(s, g, false, steps)) << "two markers per timed op without sharing";
  EXPECT_EQ(shared.markers, expected_markers(s, g, true, steps));
  // One GPU, one compute stream for almost everything: close to n + 1 markers per step, not 2n.
  // (Host ops record a marker behind their deps: `host` per step, the same in both modes.)
  const std::size_t n = device_ops(g.class_of(0));
  const std::size_t per_step_unshared = (unshared.markers - 1) / static_cast<std::size_t>(steps);
  ASSERT_GE(per_step_unshared, 2 * n + 2);
  const std::size_t host = per_step_unshared - (2 * n + 2);
  EXPECT_LE(host, 4U);
  const std::size_t per_step_shared = (shared.markers - 1) / static_cast<std::size_t>(steps);
  EXPECT_LE(per_step_shared, n + 1 + host + n / 20)
      << "ops on one stream: n + 1 markers per step, plus the few a break costs (n = " << n << ")";
  std::printf("one GPU, %zu device ops per step: %zu markers per recorded step unshared, %zu shared\n", n,
              per_step_unshared, per_step_shared);
  // The same records, in the same number.
  EXPECT_EQ(shared.data.phases.size(), unshared.data.phases.size());
}

TEST(Executor, ACrossStreamWaitBreaksTheSharing) {
  // Shared experts on their own stream, gradient reduction overlapped on dp_comm, experts on 2
  // streams: many ops wait for another stream.
  const Scenario s = scenario_from(small_moe(
      "ep = 2", "overlap_grad_reduce = true\nmoe_shared_expert_overlap = true\nexpert_execution = \"streams:2\"\n", 2,
      "moe_shared_expert_intermediate_size = 256\n"));
  const StepGraph g = scenarios::expand(s, 0);
  for (int r = 0; r < 2; ++r) {
    for (const Op& op : g.class_of(r).ops) ASSERT_FALSE(op.kind == OpKind::send || op.kind == OpKind::recv);
  }
  const int steps = 1;
  const std::size_t want = expected_markers(s, g, true, steps);
  ASSERT_NE(want, expected_markers(s, g, true, steps, false)) << "the scenario has cross-stream waits to break it";
  const Counted shared = run_counted(s, true, steps, device_behind());
  EXPECT_EQ(shared.markers, want);
  EXPECT_LT(shared.markers, expected_markers(s, g, false, steps));
}

TEST(Executor, AnIdleStreamGetsAFreshStartMarker) {
  // The host is behind: the stream has passed the previous op's end marker whenever the next op is
  // issued; sharing would put the idle gap into the next op's record, so every op gets its own.
  const Scenario s = scenario_from(small_moe("tp = 1", "", 1));
  const StepGraph g = scenarios::expand(s, 0);
  const Counted behind = run_counted(s, true, 1, {}, true);
  EXPECT_EQ(behind.markers, expected_markers(s, g, false, 1));
}

using Key = std::tuple<int, std::string, int, int, int>;  // rank, phase, layer, microbatch, expert

// Records against the fake device's timeline: the markers sit right around each op on its stream,
// shared or not (start(B) = end(A) is the point where the stream starts B).
void expect_records_follow_the_trace(const Scenario& s, const Counted& run, const std::string& what) {
  const StepGraph g = scenarios::expand(s, 0);
  std::map<std::pair<int, int>, double> epoch;  // (step, rank)
  for (const auto& st : run.data.steps) epoch[{st.step, st.rank}] = st.epoch_us;
  std::map<Key, std::pair<double, double>> rec;
  for (const auto& p : run.data.phases) {
    if (p.step != 0) continue;
    rec[{p.rank, run.data.names.phases.name(p.phase), p.layer, p.microbatch, p.expert}] = {
        epoch.at({p.step, p.rank}) + p.start_us, p.dur_us};
  }
  // Iteration 1 (after the warm-up) is measured step 0.
  std::map<std::pair<int, std::uint32_t>, int> seen;
  std::vector<testing::Placed> placed;
  for (const auto& e : run.trace) {
    if (seen[{e.rank, e.op}]++ != 1) continue;
    const Op& op = g.class_of(e.rank).ops[e.op];
    if (op.is_comm()) continue;  // collectives start at the rendezvous, not at their marker
    const auto it = rec.find({e.rank, g.phase_name(op), op.layer, op.microbatch, op.expert});
    ASSERT_NE(it, rec.end()) << what;
    placed.push_back({it->second.first, it->second.second, e.start_us, e.end_us - e.start_us, g.phase_name(op)});
  }
  testing::expect_records_follow_the_trace(placed, what);
}

TEST(Executor, RecordsAreTheSameWithAndWithoutSharedMarkers) {
  const Scenario s = scenario_from(small_moe("tp = 1", "", 1));
  FakeDeviceOptions fo;
  fo.min_op_us = 500.0;  // long ops: sleep jitter on a loaded CI machine is small against them
  const Counted shared = run_counted(s, true, 1, fo);
  const Counted unshared = run_counted(s, false, 1, fo);
  ASSERT_LT(shared.markers, unshared.markers) << "the shared run shares markers";
  expect_records_follow_the_trace(s, shared, "shared");
  expect_records_follow_the_trace(s, unshared, "unshared");
}

}  // namespace
}  // namespace threewalls::backend
