#include "threewalls/backend/executor.hpp"

#include <execinfo.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "threewalls/backend/caching_allocator.hpp"
#include "threewalls/backend/saved_activations.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/version.hpp"
#include "threewalls/profiler/record_sink.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/profiler/step_recorder.hpp"
#include "threewalls/records/records.hpp"
#include "threewalls/scenarios/parameters.hpp"
#include "threewalls/scenarios/stepper.hpp"

namespace threewalls::backend {

using scenarios::Group;
using scenarios::HostKind;
using scenarios::Op;
using scenarios::OpKind;
using scenarios::RankClass;
using scenarios::StepGraph;

// ---------------------------------------------------------------------------------------------
// Building blocks
// ---------------------------------------------------------------------------------------------

std::string base_stream_name(const std::string& name) {
  for (const char* suffix : {"_send", "_recv"}) {
    const std::string suf(suffix);
    if (name.size() > suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0) {
      return name.substr(0, name.size() - suf.size());
    }
  }
  return name;
}

std::string comm_key(const StepGraph& g, int rank, const Op& op) {
  std::string key = std::string(scenarios::to_string(op.group)) + "@";
  if (op.kind == OpKind::send || op.kind == OpKind::recv) {
    const int peer = g.layout.peer_of(op, rank);
    const bool send = op.kind == OpKind::send;
    return key + base_stream_name(g.stream_name(op)) + ":" + std::to_string(send ? rank : peer) + ">" +
           std::to_string(send ? peer : rank);
  }
  return key + g.stream_name(op);
}

bool CommInstance::operator<(const CommInstance& o) const { return std::tie(key, members) < std::tie(o.key, o.members); }

std::vector<CommInstance> comm_instances(const std::vector<const StepGraph*>& graphs) {
  std::set<CommInstance> instances;
  std::set<std::pair<int, std::string>> uses;  // (rank, key)
  std::map<std::string, std::string> example;  // key -> an op that uses it (for messages)
  for (const StepGraph* g : graphs) {
    const int world = g->layout.world();
    for (int r = 0; r < world; ++r) {
      for (const Op& op : g->class_of(r).ops) {
        if (!op.is_comm() || op.group == Group::none) continue;
        CommInstance ci;
        ci.key = comm_key(*g, r, op);
        if (!uses.emplace(r, ci.key).second) continue;
        ci.group = op.group;
        ci.p2p = op.kind == OpKind::send || op.kind == OpKind::recv;
        if (ci.p2p) {
          const int peer = g->layout.peer_of(op, r);
          ci.members = {std::min(r, peer), std::max(r, peer)};
        } else {
          ci.stream = op.stream;
          ci.members = g->layout.group_members(op.group, r);
        }
        example.emplace(ci.key, g->phase_name(op));
        instances.insert(ci);
      }
    }
  }
  // Every member of an instance must use it (else a collective would wait forever for a rank that
  // never joins, or a send for a receive that never comes: the graph is inconsistent).
  for (const CommInstance& ci : instances) {
    for (int m : ci.members) {
      if (uses.count({m, ci.key}) == 0) {
        throw InputError("StepGraph: rank " + std::to_string(ci.members.front() == m ? ci.members.back() : ci.members.front()) +
                         " uses communicator " + ci.key + " (" + example[ci.key] + ") but its member rank " +
                         std::to_string(m) + " has no op on it; the real backend cannot run a " +
                         (ci.p2p ? "send without its receive" : "collective some members never join"));
      }
    }
  }
  return {instances.begin(), instances.end()};
}

std::vector<CommSpec> comm_specs(const std::vector<CommInstance>& instances, const std::vector<CommId>& ids,
                                 const StepGraph& /*graph*/, int rank) {
  std::vector<CommSpec> out;
  for (std::size_t i = 0; i < instances.size(); ++i) {
    const CommInstance& ci = instances[i];
    const auto it = std::find(ci.members.begin(), ci.members.end(), rank);
    if (it == ci.members.end()) continue;
    CommSpec s;
    s.key = ci.key;
    s.p2p = ci.p2p;
    s.group = ci.group;
    s.stream = ci.stream;
    s.members = ci.members;
    s.index = static_cast<int>(it - ci.members.begin());
    s.id = ids.at(i);
    out.push_back(std::move(s));
  }
  return out;
}

void all_to_all_split(const Op& op, int group_size, int own_index, double imbalance, std::vector<std::size_t>& send_bytes,
                      std::vector<std::size_t>& recv_bytes) {
  const auto n = static_cast<std::size_t>(std::max(group_size, 1));
  send_bytes.assign(n, 0);
  recv_bytes.assign(n, 0);
  const scenarios::RoutingModel routing(group_size, imbalance);
  const double balanced = op.shape[1] != 0 && op.shape[0] > 0 ? static_cast<double>(op.shape[0]) : op.bytes;
  // Whole bf16 elements; both sides evaluate the same expression, so they agree on every pair.
  auto bytes = [](double b) { return static_cast<std::size_t>(std::max(0.0, std::floor(b / 2.0))) * 2; };
  for (std::size_t j = 0; j < n; ++j) {
    const int jj = static_cast<int>(j);
    switch (op.shape[1]) {
      case 1:  // dispatch: I send B share(j) to j; j sends B share(me) to me
        send_bytes[j] = bytes(balanced * routing.share(jj));
        recv_bytes[j] = bytes(balanced * routing.share(own_index));
        break;
      case 2:  // combine: I send B share(me) to everyone; j sends B share(j) to me
        send_bytes[j] = bytes(balanced * routing.share(own_index));
        recv_bytes[j] = bytes(balanced * routing.share(jj));
        break;
      default:
        send_bytes[j] = bytes(balanced / static_cast<double>(n));
        recv_bytes[j] = send_bytes[j];
        break;
    }
  }
}

namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr std::uint32_t kNone = 0xffffffffU;
constexpr std::chrono::microseconds kPollSlice{200};

std::string seconds_text(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

// Raised in a rank that stops because another rank failed.
class StoppedByPeer : public SystemError {
 public:
  using SystemError::SystemError;
};

// FNV-1a over the bytes of trivially copyable values.
struct Fnv {
  std::uint64_t h = 1469598103934665603ULL;
  template <class T>
  void add(const T& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      h ^= p[i];
      h *= 1099511628211ULL;
    }
  }
};

// StepRecorder's clock over a Device's markers.
struct DeviceClock {
  using Stream = int;
  struct Marker {
    std::uint32_t id = kNone;
    friend bool operator==(Marker a, Marker b) { return a.id == b.id; }
  };
  Device* dev = nullptr;
  Marker mark(int s) { return Marker{dev->record_marker(s)}; }
  bool done(Marker m) { return m.id == kNone || dev->marker_done(m.id); }
  double elapsed_us(Marker a, Marker b) { return a.id == kNone || b.id == kNone ? 0.0 : dev->elapsed_us(a.id, b.id); }
  void release(Marker m) {
    if (m.id != kNone) dev->release_marker(m.id);
  }
};

// ---------------------------------------------------------------------------------------------
// Run-wide state shared by the rank threads and the main thread
// ---------------------------------------------------------------------------------------------

struct Failure {
  int rank = -1;
  std::string message;
  bool input = false;     // an InputError (exit code 2) rather than a system failure
  bool by_peer = false;   // stopped because another rank failed
};

struct RunState {
  // Fixed before the threads start.
  scenarios::Scenario scenario;  // a copy: a rank thread given up on may outlive execute()
  std::vector<std::shared_ptr<const StepGraph>> graphs;  // by graph index
  std::vector<int> graph_of_iteration;
  int warmup = 0;
  int steps = 0;
  std::vector<CommInstance> comm_instances;
  std::vector<CommId> comm_ids;
  ExecutorOptions options;
  profiler::SamplingPolicy policy;
  std::function<double()> host_now_us;
  DeviceFactory factory;
  int local_count = 0;

  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Failure> failures;
  int opened = 0;          // local ranks whose device is open
  bool go = false;         // the main thread created the writer: run the steps
  int finished = 0;        // rank threads that returned
  int barrier_count = 0;
  int barrier_gen = 0;
  std::string device_name;
  OrderedJson device_settings;
  std::shared_ptr<profiler::RecordSink> sink;  // set before go
  std::vector<RankReport> reports;

  void fail(int rank, const std::string& message, bool input, bool by_peer) {
    {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(Failure{rank, message, input, by_peer});
      stop.store(true);
    }
    cv.notify_all();
  }
  // Local ranks wait for each other; a stop releases everyone.
  // `alive` is called while waiting (the watchdog sees a waiting rank as alive).
  template <class Alive>
  void barrier(int rank, Alive&& alive) {
    std::unique_lock<std::mutex> lock(mu);
    const int gen = barrier_gen;
    if (++barrier_count == local_count) {
      barrier_count = 0;
      ++barrier_gen;
      cv.notify_all();
      return;
    }
    while (!cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return gen != barrier_gen || stop.load(); })) {
      alive();
    }
    if (gen == barrier_gen) throw StoppedByPeer("rank " + std::to_string(rank) + ": stopped while waiting for the other ranks");
  }
};

// ---------------------------------------------------------------------------------------------
// Per-graph plan of one rank
// ---------------------------------------------------------------------------------------------

struct OpInfo {
  profiler::PhaseRecord tmpl;
  int starts_run = -1;      // index into Plan::runs when a graph run starts at this op
  int in_run = -1;          // the graph run containing this op
  bool host = false;        // done when the host moves on (host ops, copies that block the host)
  bool needs_event = false; // some later op waits for it across streams, runs or on the host
  bool capture_event = false;  // a later op of the same graph run waits for it on another stream
  std::uint32_t group_end = 0;  // send/recv leading a group of adjacent ones on its stream: one past the last
  bool grouped = false;         // a send/recv issued by its group's leader
};

struct RunInfo {
  scenarios::GraphRun run;
  int origin = 0;
  std::vector<int> streams;  // streams with ops in the run, origin first
  std::uint64_t signature = 0;
};

struct Plan {
  std::shared_ptr<const StepGraph> graph;
  const RankClass* rc = nullptr;
  std::vector<OpInfo> ops;
  std::vector<RunInfo> runs;
  std::vector<int> streams;  // device streams used
  int anchor = 0;            // the stream steps are fenced on (compute when present)
};

std::string describe_op(const StepGraph& g, const Op& op) {
  std::string s = g.phase_name(op);
  if (op.layer >= 0) s += " layer " + std::to_string(op.layer);
  if (op.microbatch >= 0) s += " microbatch " + std::to_string(op.microbatch);
  if (op.expert >= 0) s += " expert " + std::to_string(op.expert);
  s += " (" + std::string(scenarios::to_string(op.kind));
  if (op.is_comm()) s += " over " + std::string(scenarios::to_string(op.group));
  return s + " on stream " + g.stream_name(op) + ")";
}

Plan build_plan(const std::shared_ptr<const StepGraph>& graph, int rank, profiler::RecordSink* sink, Device& dev) {
  Plan p;
  p.graph = graph;
  const StepGraph& g = *graph;
  const RankClass& rc = g.class_of(rank);
  p.rc = &rc;
  const std::size_t n = rc.ops.size();
  p.ops.resize(n);
  // The records owner's templates (a disabled sink interns nothing; without a sink the names go nowhere).
  profiler::Names unrecorded;
  const std::vector<profiler::PhaseRecord> templates =
      sink != nullptr ? records::OpRecords(g, *sink).of_rank(rank) : records::OpRecords(g, unrecorded).of_rank(rank);
  std::set<int> used;
  for (std::size_t i = 0; i < n; ++i) {
    const Op& op = rc.ops[i];
    OpInfo& info = p.ops[i];
    info.host = op.kind == OpKind::host || dev.blocks_host(op);
    if (op.kind != OpKind::host && !dev.blocks_host(op)) used.insert(op.stream);
    info.tmpl = templates[i];
  }
  for (std::size_t ri = 0; ri < rc.graph_runs.size(); ++ri) {
    const scenarios::GraphRun& gr = rc.graph_runs[ri];
    RunInfo run;
    run.run = gr;
    // One capture per run (its position is part of the key): a timed copy's pinned markers must be
    // replayed once per step, or a second replay would overwrite them before they are read.
    Fnv h;
    h.add(gr.first_op);
    h.add(gr.end_op - gr.first_op);
    for (std::uint32_t k = gr.first_op; k < gr.end_op; ++k) {
      const Op& op = rc.ops[k];
      if (op.kind == OpKind::host || dev.blocks_host(op)) {
        throw InputError("rank " + std::to_string(rank) + ": op " + describe_op(g, op) + " is inside CUDA-graph run " +
                         g.graphs[static_cast<std::size_t>(gr.graph - 1)] +
                         " but blocks the host; it cannot be captured (remove its scope from cuda_graph_scope)");
      }
      p.ops[k].in_run = static_cast<int>(ri);
      if (std::find(run.streams.begin(), run.streams.end(), op.stream) == run.streams.end()) run.streams.push_back(op.stream);
      h.add(op.kind);
      h.add(op.sub);
      h.add(op.shape);
      h.add(op.stream);
      h.add(op.dtype);
      h.add(op.flags);
      h.add(op.group);
      h.add(op.bytes);
      h.add(op.peer);
      for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
        const std::uint32_t dep = rc.deps_of(op)[d];
        h.add(dep >= gr.first_op ? dep - gr.first_op : kNone);
      }
    }
    run.origin = rc.ops[gr.first_op].stream;
    run.signature = h.h;
    p.ops[gr.first_op].starts_run = static_cast<int>(p.runs.size());
    p.runs.push_back(std::move(run));
  }
  // Send/recv ops adjacent in issue order on one stream form one NCCL group (as the simulator does).
  auto is_p2p = [](const Op& op) { return op.kind == OpKind::send || op.kind == OpKind::recv; };
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i + 1;
    if (is_p2p(rc.ops[i])) {
      while (j < n && is_p2p(rc.ops[j]) && rc.ops[j].stream == rc.ops[i].stream && p.ops[j].in_run == p.ops[i].in_run &&
             p.ops[j].starts_run < 0) {
        p.ops[j].grouped = true;
        ++j;
      }
      if (j > i + 1) p.ops[i].group_end = static_cast<std::uint32_t>(j);
    }
    i = j;
  }
  // Which ops something waits for.
  for (std::size_t j = 0; j < n; ++j) {
    const Op& op = rc.ops[j];
    const OpInfo& jj = p.ops[j];
    for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
      const std::uint32_t dep = rc.deps_of(op)[d];
      if (dep >= j) {
        throw InputError("rank " + std::to_string(rank) + ": op " + describe_op(g, op) +
                         " depends on a later op; the StepGraph contract allows only earlier ops");
      }
      OpInfo& dd = p.ops[dep];
      if (dd.host) continue;  // finished before the host moved on
      const bool same_run = jj.in_run >= 0 && jj.in_run == dd.in_run;
      if (same_run) {
        if (rc.ops[dep].stream != op.stream) dd.capture_event = true;
        continue;
      }
      if (jj.host || rc.ops[dep].stream != op.stream || jj.in_run >= 0 || dd.in_run >= 0) dd.needs_event = true;
    }
  }
  p.streams.assign(used.begin(), used.end());
  p.anchor = p.streams.empty() ? 0 : p.streams.front();
  for (int s : p.streams) {
    if (g.streams[static_cast<std::size_t>(s)].name == "compute") p.anchor = s;
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// One rank thread
// ---------------------------------------------------------------------------------------------

class RankWorker {
 public:
  RankWorker(std::shared_ptr<RunState> st, int rank, int local_index)
      : st_(std::move(st)), rank_(rank), local_index_(local_index) {}

  // The whole life of the rank: open the device, run the steps, report. Never throws.
  void main() {
    thread_ = pthread_self();
    try {
      run();
    } catch (const StoppedByPeer& e) {
      abort_device();
      st_->fail(rank_, e.what(), false, true);
    } catch (const InputError& e) {
      abort_device();
      st_->fail(rank_, with_rank(e.what()), true, false);
    } catch (const std::exception& e) {
      abort_device();
      st_->fail(rank_, with_rank(e.what()), false, false);
    }
    try {
      teardown();
    } catch (const std::exception& e) {
      st_->fail(rank_, who() + "teardown: " + e.what(), false, false);
    }
    done_.store(true);
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      ++st_->finished;
    }
    st_->cv.notify_all();
  }
  // The thread that runs main(), once it started; whether main() has returned.
  [[nodiscard]] pthread_t thread() const { return thread_; }
  [[nodiscard]] bool done() const { return done_.load(); }

 private:
  using Recorder = profiler::StepRecorder<DeviceClock>;
  using Marker = DeviceClock::Marker;

  // A graph run's captures: one untimed, and (recording ranks) one timed copy per step that may be
  // in flight, used in turn: a copy is replayed again only after its previous replay's step has
  // finished on the device and been harvested (the run-ahead wait guarantees it).
  struct Captured {
    std::uint32_t untimed = kNone;
    std::vector<std::uint32_t> timed;
    std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> marks;
    std::size_t next = 0;
  };

  [[nodiscard]] std::string who() const { return "rank " + std::to_string(rank_) + ": "; }
  // Messages start with the rank (the device's errors already do).
  [[nodiscard]] std::string with_rank(const std::string& m) const {
    return m.rfind("rank ", 0) == 0 ? m : who() + m;
  }

  void abort_device() noexcept {
    if (recorder_) recorder_->release_all();
    if (dev_) dev_->abort();
  }

  void teardown() {
    recorder_.reset();
    captured_.clear();
    saved_alloc_.reset();  // gives its segments back to the device first
    {
      // After this the watchdog cannot reach the device (it holds dev_mu_ while it aborts).
      std::lock_guard<std::mutex> lock(dev_mu_);
      published_dev_ = nullptr;
    }
    dev_.reset();
  }

 public:
  // For the main thread's watchdog. progress() changes whenever the thread issues an op or polls in a
  // wait; a thread whose count stands still is inside one device call.
  [[nodiscard]] std::uint64_t progress() const { return progress_.load(std::memory_order_relaxed); }
  [[nodiscard]] bool started() const { return started_.load(); }
  [[nodiscard]] int rank() const { return rank_; }
  // Aborts the device's communicators from another thread: a thread blocked in a device call behind a
  // collective that can no longer complete (a launch waiting for room in a full launch queue, an
  // enqueue) returns once the collective's kernel sees the abort. Idempotent; never blocks on the
  // thread itself.
  void abort_from_watchdog() noexcept {
    std::lock_guard<std::mutex> lock(dev_mu_);
    if (published_dev_ != nullptr) published_dev_->abort();
  }

 private:
  void beat() noexcept { progress_.fetch_add(1, std::memory_order_relaxed); }

  void check_stop(const char* where) const {
    if (!st_->stop.load()) return;
    std::string first;
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      for (const Failure& f : st_->failures) {
        if (!f.by_peer) {
          first = "rank " + std::to_string(f.rank);
          break;
        }
      }
    }
    throw StoppedByPeer(who() + "stopped " + where + " after " + (first.empty() ? "another rank" : first) +
                        " failed; its communicators are aborted");
  }

  [[nodiscard]] std::string step_text() const {
    return measured_ >= 0 ? "step " + std::to_string(measured_) : "warm-up step " + std::to_string(iteration_ + 1);
  }

  // Waits on the host for `event`, polling the stop flag, the device's asynchronous errors and the
  // timeout. `what()` describes the wait for messages.
  template <class What>
  void wait_host(std::uint32_t event, What&& what) {
    const auto start = SteadyClock::now();
    while (!dev_->wait_event_host(event, kPollSlice)) {
      beat();
      if (st_->stop.load()) check_stop(("waiting for " + what() + " in " + step_text()).c_str());
      dev_->poll();
      if (SteadyClock::now() - start > st_->options.timeout) {
        dev_->abort();
        throw SystemError(who() + "no progress for " + seconds_text(st_->options.timeout) + " waiting for " + what() +
                          " in " + step_text() +
                          "; a peer rank may have died or hung in a collective; this rank's communicators are aborted");
      }
    }
  }

  void run() {
    dev_ = st_->factory(rank_, local_index_);
    if (!dev_) throw SystemError(who() + "the device factory returned no device");
    {
      std::lock_guard<std::mutex> lock(dev_mu_);
      published_dev_ = dev_.get();
    }
    clock_.dev = dev_.get();
    const auto& g0 = st_->graphs.front();
    DeviceSetup setup;
    setup.rank = rank_;
    setup.world_size = g0->layout.world();
    setup.graph = g0.get();
    std::set<int> streams;
    for (const auto& g : st_->graphs) {
      for (const Op& op : g->class_of(rank_).ops) {
        // Disk reads block the host but run on their stream's OpRunner (its pinned buffer and file).
        if (op.kind != OpKind::host) streams.insert(op.stream);
      }
    }
    setup.streams.assign(streams.begin(), streams.end());
    setup.comms = comm_specs(st_->comm_instances, st_->comm_ids, *g0, rank_);
    setup.seed = st_->scenario.run.seed;
    setup.routing_imbalance = st_->scenario.train ? st_->scenario.train->routing_imbalance : 1.0;
    setup.num_experts = st_->scenario.model.num_experts;
    const scenarios::RankClass& rc = g0->class_of(rank_);
    const bool first_stage = rc.pp_stage == 0;
    const bool last_stage = rc.pp_stage == st_->scenario.parallel.pp - 1;
    if (st_->scenario.train) {
      const scenarios::ParameterStateBytes state =
          scenarios::training_parameter_state(st_->scenario, g0->layout, rc.layers, first_stage, last_stage);
      setup.parameter_weight_bytes = static_cast<std::size_t>(state.weights);
      setup.parameter_gradient_bytes = static_cast<std::size_t>(state.gradients);
    } else if (const auto& inf = *st_->scenario.infer;
               !inf.expert_offload.enabled || inf.expert_offload.tier == scenarios::OffloadTier::hbm) {
      // Inference with every weight in HBM holds them and a KV cache (an offloading run keeps the
      // runners' own bounded places: its experts come from host memory).
      setup.parameter_weight_bytes = static_cast<std::size_t>(
          scenarios::inference_weight_bytes(st_->scenario, rc.layers, first_stage, last_stage));
      setup.kv_cache_bytes_per_layer = static_cast<std::size_t>(scenarios::kv_cache_bytes_per_layer(st_->scenario));
    }
    setup.timeout = st_->options.timeout;
    std::weak_ptr<RunState> weak = st_;
    setup.stop_requested = [weak] {
      const auto s = weak.lock();
      return !s || s->stop.load();
    };
    dev_->open(setup, rc);
    saved_alloc_ = std::make_unique<CachingAllocator>([this](std::size_t b) { return dev_->allocate_segment(b); },
                                                      [this](void* p, std::size_t b) { dev_->free_segment(p, b); });
    sample_memory();
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      if (local_index_ == 0) {
        st_->device_name = dev_->name();
        st_->device_settings = dev_->settings();
      }
      ++st_->opened;
    }
    st_->cv.notify_all();
    // Wait until the main thread has created the run directory.
    {
      std::unique_lock<std::mutex> lock(st_->mu);
      st_->cv.wait(lock, [&] { return st_->go || st_->stop.load(); });
    }
    beat();
    started_.store(true);
    check_stop("before the first step");
    recorder_ = std::make_unique<Recorder>(clock_, st_->policy, rank_, st_->sink.get());
    annotate_ = st_->policy.enabled();
    share_markers_ = st_->options.share_timing_markers;

    const int total = st_->warmup + st_->steps;
    step_end_.assign(static_cast<std::size_t>(std::max(1, st_->options.max_steps_in_flight)), kNone);
    int current_graph = -1;
    double loop_start = st_->host_now_us();
    for (iteration_ = 0; iteration_ < total; ++iteration_) {
      measured_ = iteration_ >= st_->warmup ? iteration_ - st_->warmup : -1;
      const int gi = st_->graph_of_iteration[static_cast<std::size_t>(iteration_)];
      if (gi != current_graph) {
        const auto& g = st_->graphs[static_cast<std::size_t>(gi)];
        if (current_graph >= 0) {
          wait_previous_steps();  // buffers change only while the device is idle
          dev_->prepare(*g, g->class_of(rank_));
        }
        plan_ = build_plan(g, rank_, st_->sink.get(), *dev_);
        saved_ = plan_saved_activations(st_->scenario, g->class_of(rank_));
        saved_blocks_.assign(saved_.slots, {});
        events_.assign(plan_.ops.size(), kNone);
        current_graph = gi;
      }
      if (measured_ == 0) {
        st_->barrier(rank_, [this] { beat(); });  // measured steps start together on every local rank
        if (recorder_->enabled()) align();
        loop_start = st_->host_now_us();
      }
      step();
    }
    // Everything finished on the device, then the last records.
    wait_previous_steps();
    const double loop_end = st_->host_now_us();
    recorder_->drain([&] {
      beat();
      check_stop("while collecting the last records");
      dev_->poll();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    });
    sample_memory();
    for (std::uint32_t& e : step_end_) {
      if (e != kNone) dev_->release_event(e);
      e = kNone;
    }
    RankReport rep;
    rep.rank = rank_;
    rep.peak_bytes = peak_bytes_;
    rep.peak_allocated_bytes = saved_alloc_->stats().peak_allocated;
    rep.peak_reserved_bytes = saved_alloc_->stats().peak_reserved;
    rep.loop_us = st_->steps > 0 ? loop_end - loop_start : 0.0;
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->reports.push_back(rep);
  }

  void sample_memory() { peak_bytes_ = std::max(peak_bytes_, dev_->memory_in_use()); }

  void wait_previous_steps() {
    for (std::uint32_t& e : step_end_) {
      if (e == kNone) continue;
      wait_host(e, [] { return std::string("the previous steps to finish on the device"); });
    }
  }

  // Anchors device time on the host clock with a marker on the idle anchor stream.
  void align() {
    wait_previous_steps();
    recorder_->harvest();
    if (recorder_->pending_steps() != 0) return;
    const Marker m = clock_.mark(plan_.anchor);
    const double host = st_->host_now_us();
    recorder_->set_anchor(m, host);
    last_align_us_ = host;
  }

  // Re-anchors every realign_every_s when the device happens to be idle (no wait is added).
  void maybe_realign() {
    if (st_->host_now_us() - last_align_us_ < st_->options.realign_every_s * 1e6) return;
    if (recorder_->pending_steps() != 0) return;
    for (std::uint32_t e : step_end_) {
      if (e != kNone && !dev_->event_done(e)) return;
    }
    align();
  }

  void step() {
    const RankClass& rc = *plan_.rc;
    // Host run-ahead: at most max_steps_in_flight steps queued on the device.
    std::uint32_t& slot = step_end_[static_cast<std::size_t>(iteration_) % step_end_.size()];
    if (slot != kNone) {
      wait_host(slot, [] { return std::string("an earlier step to finish on the device"); });
      dev_->release_event(slot);
      slot = kNone;
    }
    recorder_->harvest();
    dev_->poll();
    check_stop("between steps");
    sample_memory();
    for (const RunInfo& run : plan_.runs) static_cast<void>(capture(run));  // outside timing

    bool rec = false;
    if (measured_ >= 0) {
      if (recorder_->enabled() && st_->policy.records(measured_)) maybe_realign();
      rec = recorder_->begin_step(measured_, plan_.anchor);
    }
    // Fence: no stream starts before the epoch on the anchor.
    const std::uint32_t start_ev = dev_->record_event(plan_.anchor);
    step_events_.push_back(start_ev);
    for (int s : plan_.streams) {
      if (s != plan_.anchor) dev_->wait_event(s, start_ev);
    }
    forget_ends();  // never share a marker across steps (nor across the fence just enqueued)
    const std::uint32_t n = static_cast<std::uint32_t>(rc.ops.size());
    const bool inject = st_->options.fault != ExecutorOptions::Fault::none && st_->options.fault_rank == rank_ &&
                        st_->options.fault_step == measured_;
    for (std::uint32_t i = 0; i < n;) {
      beat();
      // A stop between two ops: never issue more work behind a collective whose peer is gone.
      if (st_->stop.load(std::memory_order_relaxed)) check_stop(("issuing the ops of " + step_text()).c_str());
      if (inject && i >= n / 2) inject_fault(i);
      const OpInfo& info = plan_.ops[i];
      if (info.starts_run >= 0) {
        const RunInfo& run = plan_.runs[static_cast<std::size_t>(info.starts_run)];
        hold_saved(run.run.end_op);
        issue_run(run, rec);
        i = run.run.end_op;
        release_saved(i);
        continue;
      }
      const Op& op = rc.ops[i];
      if (info.group_end > 0) {
        hold_saved(info.group_end);
        issue_group(i, info.group_end, rec);
        i = info.group_end;
        release_saved(i);
        continue;
      }
      hold_saved(i + 1);
      if (op.kind == OpKind::host) {
        host_op(i, rec);
      } else if (info.host) {
        blocking_op(i, rec);
      } else {
        issue_op(i, rec);
      }
      ++i;
      release_saved(i);
    }
    hold_next_ = 0;
    release_next_ = 0;
    forget_ends();
    // Join every stream into the anchor: the step ends when its last op does.
    for (int s : plan_.streams) {
      if (s == plan_.anchor) continue;
      const std::uint32_t e = dev_->record_event(s);
      dev_->wait_event(plan_.anchor, e);
      step_events_.push_back(e);
    }
    if (measured_ >= 0) recorder_->end_step(rec ? clock_.mark(plan_.anchor) : Marker{});
    slot = dev_->record_event(plan_.anchor);
    for (std::uint32_t e : step_events_) dev_->release_event(e);
    step_events_.clear();
    std::fill(events_.begin(), events_.end(), kNone);
  }

  // Saved activations (saved_activations.hpp), in host issue order: the holds of the ops before `end`
  // are taken before those ops are issued, their releases after.
  void hold_saved(std::uint32_t end) {
    for (; hold_next_ < saved_.holds.size() && saved_.holds[hold_next_].op < end; ++hold_next_) {
      const SavedActivationPlan::Hold& h = saved_.holds[hold_next_];
      try {
        saved_blocks_[h.slot].push_back(saved_alloc_->allocate(h.bytes));
      } catch (const OutOfMemory& e) {
        throw OutOfMemory(who() + "saved activations of " + describe_op(*plan_.graph, plan_.rc->ops[h.op]) + " in " +
                          step_text() + ": " + e.what() + "; " + std::to_string(dev_->memory_in_use()) +
                          " bytes in use on the device");
      }
    }
  }
  void release_saved(std::uint32_t end) {
    for (; release_next_ < saved_.releases.size() && saved_.releases[release_next_].op < end; ++release_next_) {
      std::vector<void*>& blocks = saved_blocks_[saved_.releases[release_next_].slot];
      for (void* p : blocks) saved_alloc_->free(p);
      blocks.clear();
    }
  }

  // --inject-fault: fail now, or hang (issue nothing more, raise nothing) until the run is stopped.
  void inject_fault(std::uint32_t i) {
    const std::string where = step_text() + " before op " + std::to_string(i) + " (" +
                              describe_op(*plan_.graph, plan_.rc->ops[i]) + ")";
    if (st_->options.fault == ExecutorOptions::Fault::fail) {
      throw SystemError(who() + "injected failure (--inject-fault) in " + where);
    }
    // Peers notice the hang by their timeout and stop the run; a run without peers (one rank) has
    // nobody to notice, so the hung rank gives up itself, after twice the timeout: a peer's clock
    // starts at its own last progress, a little later than this one, and on a loaded host the hung
    // rank gave up first with the same timeout, so the run's error named the hang instead of the
    // peer that noticed it.
    const auto start = SteadyClock::now();
    const auto give_up = 2 * st_->options.timeout;
    while (!st_->stop.load()) {
      beat();  // a host loop that polls the stop flag, not a device call
      if (SteadyClock::now() - start > give_up) {
        throw SystemError(who() + "injected hang (--inject-fault) in " + where + ": nobody stopped the run within " +
                          seconds_text(give_up));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    throw StoppedByPeer(who() + "injected hang (--inject-fault) in " + where + " ended: the run was stopped");
  }

  void record_event_after(std::uint32_t i, int stream) {
    events_[i] = dev_->record_event(stream);
    step_events_.push_back(events_[i]);
  }

  // Makes `stream` wait for the deps of op i that it does not already follow. Returns whether it
  // enqueued a wait (which ends the sharing of timing markers on the stream).
  bool wait_deps(std::uint32_t i, int stream) {
    const RankClass& rc = *plan_.rc;
    const Op& op = rc.ops[i];
    bool waited = false;
    for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
      const std::uint32_t dep = rc.deps_of(op)[d];
      const OpInfo& dd = plan_.ops[dep];
      if (dd.host) continue;
      if (dd.in_run < 0 && rc.ops[dep].stream == stream) continue;  // FIFO
      dev_->wait_event(stream, events_[dep]);
      waited = true;
    }
    return waited;
  }

  // Shared boundary markers (docs/profiler.md): on a recorded step, an op B issued on stream s right
  // after a timed op A on s, with nothing enqueued on s in between, starts at A's end marker
  // (start(B) = end(A): the same point of the stream under FIFO) instead of recording its own start
  // marker, so n back-to-back timed ops cost n + 1 markers, not 2n. last_end_[s] is A's end marker
  // while it is still the last thing enqueued on s, none otherwise. What breaks the sharing: a
  // cross-stream wait (wait_deps), a synchronisation event recorded behind A (needs_event: its record
  // would run on the stream between end(A) and B, inside B's record), an untimed launch, and
  // everything that is not a plain eager op (host ops and their markers, disk reads, graph runs, the
  // step's fence and join): those forget every stream's end marker.
  // And B shares only while the stream has not reached end(A) yet: B then runs right behind it. Once
  // the stream has passed it, the stream is idle (or about to be) waiting for the host, and
  // start(B) = end(A) would put that idle gap inside B's record: B records its own start marker
  // instead (one non-blocking query, where the marker record would have been; what the stream does
  // between the query and the launch is in an unshared record as well): StepRecorder::start_after.
  Recorder::Start start_marker(int s, const Marker& prev, bool timed) {
    if (!timed) return {Marker{}, Recorder::Owns::end};
    return recorder_->start_after(s, share_markers_ ? prev : Marker{});
  }
  Marker& last_end(int s) {
    const auto k = static_cast<std::size_t>(s);
    if (k >= last_end_.size()) last_end_.resize(k + 1);
    return last_end_[k];
  }
  void forget_ends() { std::fill(last_end_.begin(), last_end_.end(), Marker{}); }

  void issue_op(std::uint32_t i, bool rec) {
    const Op& op = plan_.rc->ops[i];
    const OpInfo& info = plan_.ops[i];
    const int s = op.stream;
    Marker& prev = last_end(s);
    if (wait_deps(i, s)) prev = Marker{};
    const bool timed = rec && recorder_->records_phase(info.tmpl.coarse);
    const auto [m0, owns] = start_marker(s, prev, timed);  // start(op) = end(previous timed op on s)
    prev = Marker{};
    dev_->launch(*plan_.graph, op, s, annotate_);
    if (timed) {
      // When the launch call returned: a stream that had reached the start marker before this
      // waited for the host (the record's launch_wait_us, as the simulator's host lane computes it).
      const double launched = st_->host_now_us();
      const Marker m1 = clock_.mark(s);
      recorder_->device_phase(info.tmpl, m0, m1, owns, launched);
      if (share_markers_ && !info.needs_event) prev = m1;
    }
    if (info.needs_event) record_event_after(i, s);
  }

  // A group of adjacent send/recv ops [first, end) on one stream: one NCCL group; each member timed
  // from before the group to after it (the members of a group cannot be told apart on the stream).
  void issue_group(std::uint32_t first, std::uint32_t end, bool rec) {
    const RankClass& rc = *plan_.rc;
    const int s = rc.ops[first].stream;
    std::vector<const Op*> ops;
    bool waited = false;
    for (std::uint32_t k = first; k < end; ++k) {
      waited = wait_deps(k, s) || waited;
      ops.push_back(&rc.ops[k]);
    }
    const bool timed = rec && recorder_->records_phase(plan_.ops[first].tmpl.coarse);
    if (share_markers_) {
      // One start and one end marker for the whole group (its members share both: they cannot be
      // told apart on the stream), the start shared with the previous timed op on s when possible.
      Marker& prev = last_end(s);
      if (waited) prev = Marker{};
      const auto [m0, owns] = start_marker(s, prev, timed);
      prev = Marker{};
      dev_->launch_p2p_group(*plan_.graph, ops, s, annotate_);
      Marker m1;
      if (timed) m1 = clock_.mark(s);
      bool event = false;
      for (std::uint32_t k = first; k < end; ++k) {
        if (timed) recorder_->device_phase(plan_.ops[k].tmpl, m0, m1, k == first ? owns : Recorder::Owns::none);
        if (plan_.ops[k].needs_event) {
          record_event_after(k, s);
          event = true;
        }
      }
      if (timed && !event) prev = m1;
      return;
    }
    std::vector<Marker> starts;
    if (timed) {
      for (std::uint32_t k = first; k < end; ++k) starts.push_back(clock_.mark(s));
    }
    dev_->launch_p2p_group(*plan_.graph, ops, s, annotate_);
    for (std::uint32_t k = first; k < end; ++k) {
      if (timed) recorder_->device_phase(plan_.ops[k].tmpl, starts[k - first], clock_.mark(s));
      if (plan_.ops[k].needs_event) record_event_after(k, s);
    }
  }

  // On recorded steps, a timing marker behind the device work a host op is about to wait for, on each
  // stream of its deps: the op's record starts when that work is done (or when the host arrived, if
  // later), as in the simulator; the wait itself is a gap on the host.
  std::vector<Marker> markers_behind_deps(std::uint32_t i, bool timed, int extra_stream) {
    std::vector<Marker> out;
    if (!timed) return out;
    const RankClass& rc = *plan_.rc;
    const Op& op = rc.ops[i];
    std::vector<int> streams;
    if (extra_stream >= 0) streams.push_back(extra_stream);
    for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
      const std::uint32_t dep = rc.deps_of(op)[d];
      if (plan_.ops[dep].host) continue;
      const int s = rc.ops[dep].stream;
      if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
    }
    for (int s : streams) out.push_back(clock_.mark(s));
    return out;
  }

  // Host ops: the host arrives at t0, waits for the deps, does the op, goes on at t1.
  void host_op(std::uint32_t i, bool rec) {
    forget_ends();  // its markers and reads are enqueued on the streams of its deps
    const RankClass& rc = *plan_.rc;
    const StepGraph& g = *plan_.graph;
    const Op& op = rc.ops[i];
    const double t0 = st_->host_now_us();
    const bool timed = rec && recorder_->records_phase(plan_.ops[i].tmpl.coarse);
    int read_stream = -1;
    for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
      const std::uint32_t dep = rc.deps_of(op)[d];
      if (plan_.ops[dep].host) continue;
      read_stream = rc.ops[dep].stream;
      break;
    }
    const bool read = op.host_kind() == HostKind::gpu_read;
    std::vector<Marker> after =
        markers_behind_deps(i, timed, read ? (read_stream >= 0 ? read_stream : plan_.anchor) : -1);
    for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
      const std::uint32_t dep = rc.deps_of(op)[d];
      if (plan_.ops[dep].host) continue;
      wait_host(events_[dep], [&] { return "the deps of host op " + describe_op(g, op); });
    }
    switch (op.host_kind()) {
      case HostKind::gpu_read: {
        // A read on the stream of its data: everything queued there first (as a framework's .item()).
        const int s = read_stream >= 0 ? read_stream : plan_.anchor;
        const std::uint32_t e = dev_->record_event(s);
        wait_host(e, [&] { return "stream " + g.streams[static_cast<std::size_t>(s)].name + " before " + describe_op(g, op); });
        dev_->release_event(e);
        dev_->host_read(s);
        break;
      }
      case HostKind::framework: dev_->host_work(op); break;
      case HostKind::stream_sync:
      case HostKind::barrier:
      case HostKind::graph_launch: break;  // the wait for the deps above is the op
    }
    const double t1 = st_->host_now_us();
    if (timed) recorder_->host_phase_after(plan_.ops[i].tmpl, std::move(after), t0, t1);
  }

  // Copies that block the host (disk reads): timed on the host clock, from when their deps are done.
  void blocking_op(std::uint32_t i, bool rec) {
    forget_ends();
    const RankClass& rc = *plan_.rc;
    const StepGraph& g = *plan_.graph;
    const Op& op = rc.ops[i];
    for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
      const std::uint32_t dep = rc.deps_of(op)[d];
      if (plan_.ops[dep].host) continue;
      wait_host(events_[dep], [&] { return "the deps of " + describe_op(g, op); });
    }
    const double t0 = st_->host_now_us();
    dev_->launch(g, op, op.stream, annotate_);
    const double t1 = st_->host_now_us();
    if (rec && recorder_->records_phase(plan_.ops[i].tmpl.coarse)) recorder_->host_phase(plan_.ops[i].tmpl, t0, t1);
  }

  Captured& capture(const RunInfo& run) {
    const auto it = captured_.find(run.signature);
    if (it != captured_.end()) return it->second;
    Captured c;
    std::vector<std::pair<std::uint32_t, std::uint32_t>> none;
    c.untimed = capture_once(run, false, none);
    if (recorder_->enabled()) {
      const std::size_t copies = std::max<std::size_t>(2, step_end_.size());
      c.marks.resize(copies);
      for (std::size_t t = 0; t < copies; ++t) c.timed.push_back(capture_once(run, true, c.marks[t]));
    }
    return captured_.emplace(run.signature, std::move(c)).first->second;
  }

  // One capture of a graph run; `timed`: with a pinned marker pair around every op the profiler
  // records at this granularity (marks[k - first_op]).
  std::uint32_t capture_once(const RunInfo& run, bool timed, std::vector<std::pair<std::uint32_t, std::uint32_t>>& marks) {
    const RankClass& rc = *plan_.rc;
    const std::uint32_t first = run.run.first_op;
    const std::uint32_t len = run.run.end_op - first;
    std::vector<std::uint32_t> cap_ev(len, kNone);
    std::vector<std::uint32_t> evs;
    std::vector<int> joined{run.origin};
    marks.assign(len, {kNone, kNone});
    dev_->begin_capture(run.origin);
    for (std::uint32_t k = first; k < run.run.end_op; ++k) {
      const Op& op = rc.ops[k];
      const int s = op.stream;
      if (plan_.ops[k].grouped) continue;  // issued by its group's leader
      if (std::find(joined.begin(), joined.end(), s) == joined.end()) {
        const std::uint32_t e = dev_->record_event(run.origin);
        dev_->wait_event(s, e);
        evs.push_back(e);
        joined.push_back(s);
      }
      for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
        const std::uint32_t dep = rc.deps_of(op)[d];
        if (dep >= first && rc.ops[dep].stream != s) dev_->wait_event(s, cap_ev[dep - first]);
      }
      const std::uint32_t last = plan_.ops[k].group_end > 0 ? plan_.ops[k].group_end : k + 1;
      for (std::uint32_t m = k + 1; m < last; ++m) {  // the other members' deps
        for (std::size_t d = 0; d < rc.num_deps(rc.ops[m]); ++d) {
          const std::uint32_t dep = rc.deps_of(rc.ops[m])[d];
          if (dep >= first && rc.ops[dep].stream != s) dev_->wait_event(s, cap_ev[dep - first]);
        }
      }
      const bool t = timed && st_->policy.records_phase(plan_.ops[k].tmpl.coarse);
      if (t) {
        for (std::uint32_t m = k; m < last; ++m) marks[m - first].first = dev_->record_marker(s);
      }
      if (last > k + 1) {
        std::vector<const Op*> ops;
        for (std::uint32_t m = k; m < last; ++m) ops.push_back(&rc.ops[m]);
        dev_->launch_p2p_group(*plan_.graph, ops, s, false);
      } else {
        dev_->launch(*plan_.graph, op, s, false);
      }
      for (std::uint32_t m = k; m < last; ++m) {
        if (t) marks[m - first].second = dev_->record_marker(s);
        if (plan_.ops[m].capture_event) {
          cap_ev[m - first] = dev_->record_event(s);
          evs.push_back(cap_ev[m - first]);
        }
      }
    }
    for (std::size_t j = 1; j < joined.size(); ++j) {
      const std::uint32_t e = dev_->record_event(joined[j]);
      dev_->wait_event(run.origin, e);
      evs.push_back(e);
    }
    const std::uint32_t graph = dev_->end_capture(run.origin);
    for (std::uint32_t e : evs) dev_->release_event(e);
    return graph;
  }

  void issue_run(const RunInfo& run, bool rec) {
    forget_ends();  // joins, a graph launch and its end event on the run's streams
    const RankClass& rc = *plan_.rc;
    Captured& c = capture(run);
    const int origin = run.origin;
    const std::uint32_t first = run.run.first_op;
    // Deps from before the run, on the launch stream.
    for (std::uint32_t k = first; k < run.run.end_op; ++k) {
      const Op& op = rc.ops[k];
      for (std::size_t d = 0; d < rc.num_deps(op); ++d) {
        const std::uint32_t dep = rc.deps_of(op)[d];
        if (dep >= first || plan_.ops[dep].host) continue;
        if (plan_.ops[dep].in_run < 0 && rc.ops[dep].stream == origin) continue;
        dev_->wait_event(origin, events_[dep]);
      }
    }
    // The run's other streams: their earlier work first (FIFO across the replay).
    for (std::size_t j = 1; j < run.streams.size(); ++j) {
      const std::uint32_t e = dev_->record_event(run.streams[j]);
      dev_->wait_event(origin, e);
      step_events_.push_back(e);
    }
    const bool timed = rec && !c.timed.empty();
    std::uint32_t graph = c.untimed;
    const std::vector<std::pair<std::uint32_t, std::uint32_t>>* marks = nullptr;
    if (timed) {
      graph = c.timed[c.next];
      marks = &c.marks[c.next];
      c.next = (c.next + 1) % c.timed.size();
    }
    dev_->launch_graph(graph, origin);
    if (timed) {
      for (std::uint32_t k = first; k < run.run.end_op; ++k) {
        const auto& m = (*marks)[k - first];
        if (m.first != kNone) recorder_->device_phase(plan_.ops[k].tmpl, Marker{m.first}, Marker{m.second});
      }
    }
    const std::uint32_t end = dev_->record_event(origin);
    step_events_.push_back(end);
    for (std::size_t j = 1; j < run.streams.size(); ++j) dev_->wait_event(run.streams[j], end);
    for (std::uint32_t k = first; k < run.run.end_op; ++k) events_[k] = end;
  }

  std::shared_ptr<RunState> st_;
  int rank_;
  int local_index_;
  std::unique_ptr<Device> dev_;
  std::mutex dev_mu_;                // guards published_dev_
  Device* published_dev_ = nullptr;  // dev_ while the watchdog may abort it
  std::atomic<std::uint64_t> progress_{0};
  pthread_t thread_{};
  std::atomic<bool> done_{false};
  std::atomic<bool> started_{false};  // past the start gate: the watchdog watches from here
  DeviceClock clock_;
  std::unique_ptr<Recorder> recorder_;
  bool annotate_ = false;
  bool share_markers_ = true;      // ExecutorOptions::share_timing_markers
  std::vector<Marker> last_end_;   // per stream: see last_end()
  Plan plan_;
  std::vector<std::uint32_t> events_;       // per op: the event after it in this step (kNone = none)
  std::vector<std::uint32_t> step_events_;  // released at the end of the step
  std::vector<std::uint32_t> step_end_;     // ring of the last steps' fence events
  int iteration_ = 0;
  int measured_ = -1;
  std::size_t peak_bytes_ = 0;
  // Saved activations: the allocator (after dev_: destroyed first), the plan of the current graph,
  // the blocks each slot holds, and the next hold and release of the step being issued.
  std::unique_ptr<CachingAllocator> saved_alloc_;
  SavedActivationPlan saved_;
  std::vector<std::vector<void*>> saved_blocks_;
  std::size_t hold_next_ = 0;
  std::size_t release_next_ = 0;
  double last_align_us_ = -1e300;
  std::unordered_map<std::uint64_t, Captured> captured_;
};

std::string combined_message(const std::vector<Failure>& failures, std::size_t root) {
  std::string msg = failures[root].message;
  for (std::size_t i = 0; i < failures.size(); ++i) {
    if (i == root) continue;
    msg += "\n  and " + failures[i].message;
  }
  return msg;
}

std::atomic<bool> g_threads_abandoned{false};  // rank_threads_abandoned()

// The call stack of a rank thread that is given up on, written to stderr by the thread itself: the
// watchdog sends it SIGUSR2, whose handler walks its own stack (backtrace, preloaded so that the
// handler allocates nothing) and writes the frames (backtrace_symbols_fd: module(+offset) [address];
// frames of a stripped binary resolve with `addr2line -e <unstripped build> <offset>`). It names the
// device call the thread is blocked in.
std::atomic<int> g_stack_written{0};

extern "C" void write_own_stack(int /*sig*/) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  g_stack_written.store(1);
}

void dump_thread_stack(pthread_t thread, int rank) {
  static const bool installed = [] {
    void* warm[1];
    backtrace(warm, 1);  // loads the unwinder now, outside the signal handler
    struct sigaction sa {};
    sa.sa_handler = write_own_stack;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGUSR2, &sa, nullptr) == 0;
  }();
  if (!installed) return;
  std::fprintf(stderr, "threewalls run: rank %d is stuck; its thread's call stack:\n", rank);
  std::fflush(stderr);
  g_stack_written.store(0);
  if (pthread_kill(thread, SIGUSR2) != 0) return;
  for (int i = 0; i < 100 && g_stack_written.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// The main thread's watchdog while the rank threads run. A rank thread can block inside one device
// call that polls nothing: a kernel launch waiting for room in the stream's launch queue behind a
// collective whose peer is gone, or an enqueue. Such a thread neither notices the stop flag nor its own
// timeout, so the main thread watches each thread's progress count:
//  - a count that stood still for the timeout (plus a second, so that a rank's own, more precise
//    timeout in a host wait fires first) fails that rank ("no progress ... inside a device call") and
//    stops the run;
//  - once the run is stopped, every thread that has not finished after kAbortAfterStop has its
//    device's communicators aborted from here (ncclCommAbort): the collective's kernel sees the abort
//    and ends, the blocked call returns and the thread stops at its next check;
//  - a thread that still has not finished stop_grace after the stop is given up on.
// Returns false when it gave up on a thread.
bool watch_ranks(RunState& st, const std::vector<std::shared_ptr<RankWorker>>& workers,
                 const ExecutorOptions& options) {
  using std::chrono::milliseconds;
  constexpr milliseconds kTick{50};
  constexpr milliseconds kAbortAfterStop{1000};
  const auto stuck_after = options.timeout + milliseconds(1000);
  const int n = st.local_count;
  std::vector<std::uint64_t> last(workers.size(), 0);
  std::vector<SteadyClock::time_point> since(workers.size(), SteadyClock::now());
  std::vector<bool> aborted(workers.size(), false);
  std::optional<SteadyClock::time_point> stopped_at;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(st.mu);
      if (st.cv.wait_for(lock, kTick, [&] { return st.finished == n; })) return true;
    }
    const auto now = SteadyClock::now();
    if (st.stop.load() && !stopped_at) stopped_at = now;
    for (std::size_t i = 0; i < workers.size(); ++i) {
      RankWorker& w = *workers[i];
      const std::uint64_t p = w.progress();
      if (p != last[i] || !w.started()) {
        last[i] = p;
        since[i] = now;
        continue;
      }
      if (!st.stop.load() && now - since[i] > stuck_after) {
        st.fail(w.rank(),
                "rank " + std::to_string(w.rank()) + ": no progress for " + seconds_text(stuck_after) +
                    " inside a device call (a launch or an enqueue blocked behind a collective that cannot "
                    "complete: a peer rank may have died or hung); this rank's communicators are aborted",
                false, false);
        stopped_at = now;
      }
    }
    if (!stopped_at) continue;
    if (now - *stopped_at > kAbortAfterStop) {
      for (std::size_t i = 0; i < workers.size(); ++i) {
        if (aborted[i]) continue;
        // Only a thread standing still: one that moves will see the stop flag at its next op or wait.
        if (now - since[i] < kAbortAfterStop) continue;
        workers[i]->abort_from_watchdog();
        aborted[i] = true;
      }
    }
    if (now - *stopped_at > options.stop_grace) {
      std::lock_guard<std::mutex> lock(st.mu);
      return st.finished == n;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// execute
// ---------------------------------------------------------------------------------------------

bool rank_threads_abandoned() { return g_threads_abandoned.load(); }

RunResult execute(const scenarios::Scenario& s, const ProcessContext& process, const DeviceFactory& make_device,
                  const ExecutorOptions& options) {
  RunResult result;
  const int steps = options.steps >= 0 ? options.steps : s.run.steps;
  const int warmup = options.warmup_steps >= 0 ? options.warmup_steps : s.run.warmup_steps;
  if (steps < 1) throw InputError("run: --steps must be at least 1 (got " + std::to_string(steps) + ")");
  if (warmup < 0) throw InputError("run: warm-up steps must not be negative (got " + std::to_string(warmup) + ")");
  if (options.max_steps_in_flight < 1) {
    throw InputError("run: max_steps_in_flight must be at least 1 (got " + std::to_string(options.max_steps_in_flight) + ")");
  }
  for (const auto& d : s.cluster.slowdowns) {
    throw InputError(s.source_path + ": [[cluster.slowdown]] (rank " + std::to_string(d.rank) +
                     ") is a simulation knob: a real run measures the GPUs it has and cannot slow one down; remove "
                     "the slowdown or use `threewalls sim`");
  }
  if (s.run.framework != scenarios::Framework::cpp) {
    throw InputError(s.source_path +
                     ": run.framework = \"pytorch_eager\" describes a PyTorch program (its kernels, host and "
                     "gradient copy); `threewalls run` is the C++ executor (run.framework = \"cpp\"): run the "
                     "scenario with python3 -m threewalls.runner, or set run.framework = \"cpp\"");
  }
  if (s.train && s.model.mtp_num_layers > 0) {
    throw InputError(s.source_path + ": model.mtp_num_layers = " + std::to_string(s.model.mtp_num_layers) +
                     " is simulated only: the CUDA backend has not run the multi-token-prediction depths on a GPU; "
                     "set 0 for `threewalls run` or use `threewalls sim`");
  }
  if (s.train) {
    // The backend's parameter state is Megatron's default precision (ParameterState).
    const auto& t = *s.train;
    const scenarios::MomentDtype fp32 = scenarios::MomentDtype::fp32;
    const char* key = !t.grad_reduce_in_fp32       ? "train.grad_reduce_in_fp32 = false"
                      : t.fp8_param_gather         ? "train.fp8_param_gather = true"
                      : t.exp_avg_dtype != fp32    ? "train.exp_avg_dtype"
                      : t.exp_avg_sq_dtype != fp32 ? "train.exp_avg_sq_dtype"
                                                   : nullptr;
    if (key != nullptr) {
      throw InputError(s.source_path + ": " + key +
                       " is simulated only: the CUDA backend keeps bf16 weights, an fp32 gradient buffer reduced in "
                       "fp32 and fp32 Adam state; remove the key for `threewalls run` or use `threewalls sim`");
    }
  }
  const int world = s.world_size();
  if (process.local_ranks.empty()) throw InputError("run: this process has no rank to run");
  std::set<int> seen;
  for (int r : process.local_ranks) {
    if (r < 0 || r >= world) {
      throw InputError("run: local rank " + std::to_string(r) + " is outside the scenario's world of " +
                       std::to_string(world) + " ranks");
    }
    if (!seen.insert(r).second) throw InputError("run: local rank " + std::to_string(r) + " is listed twice");
  }

  auto st = std::make_shared<RunState>();
  st->scenario = s;
  st->warmup = warmup;
  st->steps = steps;
  st->options = options;
  st->factory = make_device;
  st->local_count = static_cast<int>(process.local_ranks.size());
  if (process.host_now_us) {
    st->host_now_us = process.host_now_us;
  } else {
    const auto t0 = SteadyClock::now();
    st->host_now_us = [t0] { return std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count(); };
  }

  // Graphs: one for training; per step for inference (the same index as the simulator's steps).
  scenarios::Stepper stepper(s);
  auto g0 = std::make_shared<const StepGraph>(stepper.expand(0));
  st->graphs.push_back(g0);
  if (g0->varies_per_step) {
    for (int k = 1; k < std::max(warmup, steps); ++k) st->graphs.push_back(std::make_shared<const StepGraph>(stepper.expand(k)));
  }
  for (int it = 0; it < warmup + steps; ++it) {
    const int k = it < warmup ? it : it - warmup;
    st->graph_of_iteration.push_back(g0->varies_per_step ? k : 0);
  }
  result.model_flops_per_step = g0->model_flops;
  result.tokens_per_step = g0->tokens;
  result.steps = steps;
  result.warmup_steps = warmup;

  // Sampling.
  profiler::SamplingConfig sampling = records::sampling_config(s, *g0);
  if (options.out_dir.empty()) sampling.enabled = false;  // nowhere to write: nothing is recorded
  st->policy = profiler::SamplingPolicy(sampling, world);

  // Communicators.
  std::vector<const StepGraph*> gptrs;
  for (const auto& g : st->graphs) gptrs.push_back(g.get());
  st->comm_instances = comm_instances(gptrs);
  if (!st->comm_instances.empty()) {
    if (!process.make_comm_ids) throw SystemError("run: the process context cannot make communicator ids");
    st->comm_ids = process.make_comm_ids(st->comm_instances.size());
    if (st->comm_ids.size() != st->comm_instances.size()) {
      throw SystemError("run: got " + std::to_string(st->comm_ids.size()) + " communicator ids for " +
                        std::to_string(st->comm_instances.size()) + " communicators");
    }
  }

  // An existing run directory is refused before any device time is spent.
  namespace fs = std::filesystem;
  if (st->policy.enabled() && process.creator && !options.overwrite) {
    std::error_code ec;
    if (fs::exists(options.out_dir, ec) && fs::is_directory(options.out_dir, ec) && !fs::is_empty(options.out_dir, ec)) {
      throw InputError(options.out_dir.string() +
                       ": run directory exists and is not empty; results are never overwritten (choose another "
                       "directory, or pass --overwrite)");
    }
  }

  // Rank threads.
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<RankWorker>> workers;
  for (std::size_t i = 0; i < process.local_ranks.size(); ++i) {
    auto w = std::make_shared<RankWorker>(st, process.local_ranks[i], static_cast<int>(i));
    workers.push_back(w);
    threads.emplace_back([w] { w->main(); });
  }

  // Run directory once every local device is open (its name goes into the header).
  std::unique_ptr<profiler::RunDirWriter> writer;
  {
    std::unique_lock<std::mutex> lock(st->mu);
    st->cv.wait(lock, [&] { return st->opened == st->local_count || st->stop.load(); });
  }
  if (!st->stop.load()) {
    try {
      profiler::RunHeader header = records::run_header(options.source, s, *g0);
      header.device = st->device_name;
      header.argv = options.argv;
      if (!process.start_time.empty()) header.start_time = process.start_time;
      OrderedJson ex = OrderedJson::object();
      ex["threads"] = "one per local rank (GPU)";
      ex["local_ranks"] = process.local_ranks;
      ex["max_steps_in_flight"] = options.max_steps_in_flight;
      ex["timeout_s"] = static_cast<double>(options.timeout.count()) / 1000.0;
      ex["realign_every_s"] = options.realign_every_s;
      ex["communicators"] = st->comm_instances.size();
      ex["step_fence"] = "every stream joins the anchor stream at the end of a step; the next epoch is recorded there";
      ex["device"] = st->device_settings;
      if (options.fault != ExecutorOptions::Fault::none) {
        ex["inject_fault"] = OrderedJson{{"kind", options.fault == ExecutorOptions::Fault::fail ? "fail" : "hang"},
                                         {"rank", options.fault_rank},
                                         {"step", options.fault_step}};
      }
      header.settings["steps"] = steps;
      header.settings["warmup_steps"] = warmup;
      header.settings["executor"] = ex;
      if (st->policy.enabled()) {
        profiler::WriterOptions wo;
        wo.overwrite = options.overwrite;
        wo.local_ranks = process.local_ranks;
        wo.keep_records = !process.barrier;  // one process: the summary comes from memory
        wo.mode = process.creator ? profiler::WriterOptions::Mode::create : profiler::WriterOptions::Mode::join;
        wo.write_run_json = process.creator;
        if (!process.creator && process.barrier) process.barrier();
        writer = std::make_unique<profiler::RunDirWriter>(options.out_dir, header, st->policy, wo);
        if (process.creator && process.barrier) process.barrier();
      }
      st->sink = std::make_shared<profiler::RecordSink>(writer.get(), process.local_ranks);
    } catch (const InputError& e) {
      st->fail(-1, e.what(), true, false);
    } catch (const std::exception& e) {
      st->fail(-1, e.what(), false, false);
    }
  }
  {
    std::lock_guard<std::mutex> lock(st->mu);
    st->go = true;
  }
  st->cv.notify_all();

  // Wait for the rank threads, watching them (watch_ranks); after a failure give them stop_grace to stop.
  const bool gave_up = !watch_ranks(*st, workers, options);
  if (gave_up) {
    g_threads_abandoned.store(true);
    for (const auto& w : workers) {
      if (w->started() && !w->done()) dump_thread_stack(w->thread(), w->rank());
    }
  }
  std::vector<std::string> stuck;
  for (std::size_t i = 0; i < threads.size(); ++i) {
    if (gave_up) {
      // A thread stuck in a device call cannot be interrupted: leave it (it owns its state) and report.
      threads[i].detach();
      continue;
    }
    threads[i].join();
  }
  std::vector<Failure> failures;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    failures = st->failures;
    if (gave_up) {
      std::set<int> done;
      for (const Failure& f : failures) done.insert(f.rank);
      for (int r : process.local_ranks) {
        if (done.count(r) == 0) stuck.push_back(std::to_string(r));
      }
    }
  }
  if (!failures.empty()) {
    std::size_t root = 0;
    for (std::size_t i = 0; i < failures.size(); ++i) {
      if (!failures[i].by_peer) {
        root = i;
        break;
      }
    }
    std::string msg = combined_message(failures, root);
    if (!stuck.empty()) {
      std::string list;
      for (const auto& r : stuck) list += (list.empty() ? "" : ", ") + r;
      msg += "\n  and rank(s) " + list + " did not stop within " + seconds_text(options.stop_grace) +
             " (stuck in a device call; its call stack is above); gave up on them";
    }
    if (st->sink) {
      try {
        st->sink->close();
      } catch (...) {  // NOLINT(bugprone-empty-catch): the run already failed; that error is reported
      }
    }
    if (failures[root].input) throw InputError(msg);
    throw SystemError(msg);
  }

  // Records, summary, measured peaks.
  st->sink->close();
  std::map<int, Bytes> peaks;
  std::map<int, Bytes> allocated;
  std::map<int, Bytes> reserved;
  double loop_us = 0.0;
  for (const RankReport& r : st->reports) {
    peaks[r.rank] = Bytes(static_cast<double>(r.peak_bytes));
    allocated[r.rank] = Bytes(static_cast<double>(r.peak_allocated_bytes));
    reserved[r.rank] = Bytes(static_cast<double>(r.peak_reserved_bytes));
    loop_us = std::max(loop_us, r.loop_us);
  }
  result.ranks = st->reports;
  std::sort(result.ranks.begin(), result.ranks.end(), [](const RankReport& a, const RankReport& b) { return a.rank < b.rank; });
  result.mean_step_us = loop_us / steps;
  result.device = st->device_name;
  if (process.gather) {
    // Every process gathers the three peaks in the same order (gather is collective).
    auto gather = [&](std::map<int, Bytes>& out, std::size_t RankReport::*field) {
      std::vector<double> local;
      for (const RankReport& r : result.ranks) local.push_back(static_cast<double>(r.*field));
      const std::vector<double> all = process.gather(local);
      if (process.creator) {
        out.clear();
        for (std::size_t r = 0; r < all.size(); ++r) out[static_cast<int>(r)] = Bytes(all[r]);
      }
    };
    gather(peaks, &RankReport::peak_bytes);
    gather(allocated, &RankReport::peak_allocated_bytes);
    gather(reserved, &RankReport::peak_reserved_bytes);
  }
  if (writer) {
    result.phase_records = writer->phase_records_written();
    writer->close();
    if (process.barrier) process.barrier();
    if (process.creator) {
      profiler::SummaryInputs in = records::summary_inputs(s, *g0);
      // Inference: each measured step's kind, tokens, FLOPs and expert activations / cache hits from
      // its own StepGraph (as the simulator's summary), or tokens/s would use the prefill's tokens.
      for (int k = 0; k < steps; ++k) {
        const StepGraph& g = *st->graphs[static_cast<std::size_t>(st->graph_of_iteration[static_cast<std::size_t>(warmup + k)])];
        if (auto step_in = records::inference_step(g)) in.inference_steps[k] = std::move(*step_in);
      }
      in.gpu = st->device_name;
      in.measured_peak_by_rank = peaks;
      in.peak_allocated_by_rank = allocated;
      in.peak_reserved_by_rank = reserved;
      const profiler::SummaryBuilder builder(writer->header(), in);
      if (process.barrier) {
        const profiler::RunData data = profiler::RunDirReader::read(options.out_dir);
        result.summary = builder.build(data.steps, data.phases, data.names);
      } else {
        result.summary = builder.build(writer->kept_steps(), writer->kept_phases(), writer->names());
      }
      result.summary_json = builder.to_json(result.summary);
      writer->write_summary(result.summary_json);
      result.recorded = !result.summary.steps.empty();
    }
    result.run_dir = options.out_dir;
  }
  return result;
}

}  // namespace threewalls::backend
