#include "threewalls/backend/fake_device.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "threewalls/core/error.hpp"

namespace threewalls::backend {

using scenarios::Op;
using scenarios::OpKind;

namespace {

std::string id_text(const CommId& id) {
  std::string s;
  char buf[4];
  for (std::size_t i = 0; i < 16; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned char>(id.bytes[i]));
    s += buf;
  }
  return s;
}

std::string op_text(const scenarios::StepGraph& g, const Op& op) {
  std::string s = g.phase_name(op);
  if (op.layer >= 0) s += " layer " + std::to_string(op.layer);
  if (op.microbatch >= 0) s += " microbatch " + std::to_string(op.microbatch);
  if (op.kind == OpKind::collective) s += std::string(" (") + scenarios::to_string(op.collective()) + ")";
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// FakeFabric
// ---------------------------------------------------------------------------------------------

FakeFabric::FakeFabric(FakeDeviceOptions options) : options_(options), t0_(std::chrono::steady_clock::now()) {}
FakeFabric::~FakeFabric() = default;

std::vector<CommId> FakeFabric::make_ids(std::size_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CommId> ids(count);
  for (CommId& id : ids) {
    const std::uint64_t v = next_id_++;
    std::memcpy(id.bytes.data(), &v, sizeof v);
  }
  return ids;
}

double FakeFabric::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count();
}

std::vector<FakeTraceEntry> FakeFabric::trace() const {
  std::lock_guard<std::mutex> lock(mu_);
  return trace_;
}

std::size_t FakeFabric::rendezvous_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rendezvous_;
}

std::size_t FakeFabric::markers_recorded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return markers_;
}

void FakeFabric::count_marker() {
  std::lock_guard<std::mutex> lock(mu_);
  ++markers_;
}

void FakeFabric::add_trace(const FakeTraceEntry& e) {
  std::lock_guard<std::mutex> lock(mu_);
  trace_.push_back(e);
}

void FakeFabric::wake_all() {
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

void FakeFabric::arrive(const std::string& key, int size, const Arrival& me) {
  std::lock_guard<std::mutex> lock(mu_);
  Meeting& m = meetings_[key];
  if (!m.arrivals.empty() && m.arrivals.front().what != me.what && m.error.empty()) {
    m.error = "fake NCCL: communicator " + key + ": rank " + std::to_string(m.arrivals.front().rank) + " issued " +
              m.arrivals.front().what + " but rank " + std::to_string(me.rank) + " issued " + me.what +
              " at the same position (members must issue matching operations in the same order)";
  }
  m.arrivals.push_back(me);
  if (static_cast<int>(m.arrivals.size()) == size) {
    double dur = 0.0;
    for (const Arrival& a : m.arrivals) {
      dur = std::max(dur, a.duration_us);
      if (a.awaits) ++m.left;
    }
    m.end_us = now_us() + dur;
    ++rendezvous_;
    if (m.left == 0) meetings_.erase(key);
    cv_.notify_all();
  }
}

bool FakeFabric::await(const std::string& key, const std::function<bool()>& stop) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = meetings_.find(key);
  if (it == meetings_.end()) throw SystemError("fake NCCL: await of unknown meeting " + key);
  while (it->second.end_us < 0.0) {
    if (stop()) return false;
    cv_.wait_for(lock, std::chrono::milliseconds(5));
    it = meetings_.find(key);
  }
  const double end = it->second.end_us;
  const std::string error = it->second.error;
  if (--it->second.left == 0) meetings_.erase(it);
  lock.unlock();
  if (!error.empty()) throw SystemError(error);
  const double wait = end - now_us();
  if (wait > 0.0) std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(wait));
  return true;
}

bool FakeFabric::rendezvous(const std::string& key, int size, const Arrival& me, const std::function<bool()>& stop) {
  arrive(key, size, me);
  return await(key, stop);
}

// ---------------------------------------------------------------------------------------------
// FakeDevice
// ---------------------------------------------------------------------------------------------

struct FakeDevice::StreamWorker {
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Cmd> queue;
  bool quit = false;
};

FakeDevice::FakeDevice(FakeFabric& fabric, int rank) : fabric_(fabric), rank_(rank) {}

FakeDevice::~FakeDevice() {
  abort();
  for (auto& [s, w] : workers_) {
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->quit = true;
    }
    w->cv.notify_all();
  }
  for (auto& [s, w] : workers_) {
    if (w->thread.joinable()) w->thread.join();
  }
}

OrderedJson FakeDevice::settings() const {
  const FakeDeviceOptions& o = fabric_.options();
  OrderedJson j = OrderedJson::object();
  j["kind"] = "fake";
  j["model"] = "compute: flops / flops_per_us; memory and copies: bytes / bytes_per_us; communication: bytes / "
               "link_bytes_per_us after the last member arrives";
  j["flops_per_us"] = o.flops_per_us;
  j["bytes_per_us"] = o.bytes_per_us;
  j["link_bytes_per_us"] = o.link_bytes_per_us;
  j["min_op_us"] = o.min_op_us;
  j["max_op_us"] = o.max_op_us;
  return j;
}

bool FakeDevice::stopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

FakeDevice::StreamWorker& FakeDevice::worker(int stream) {
  const auto it = workers_.find(stream);
  if (it == workers_.end()) {
    throw SystemError("rank " + std::to_string(rank_) + ": fake device: stream " + std::to_string(stream) +
                      " was not created by open()");
  }
  return *it->second;
}

void FakeDevice::open(const DeviceSetup& setup, const scenarios::RankClass& cls) {
  setup_ = setup;
  for (int s : setup.streams) {
    auto w = std::make_unique<StreamWorker>();
    StreamWorker* wp = w.get();
    w->thread = std::thread([this, wp, s] {
      for (;;) {
        Cmd c;
        {
          std::unique_lock<std::mutex> lock(wp->mu);
          wp->cv.wait(lock, [&] { return wp->quit || !wp->queue.empty(); });
          if (wp->queue.empty()) return;
          c = wp->queue.front();
          wp->queue.pop_front();
        }
        wp->cv.notify_all();  // a launch waiting for room in the queue
        bool broken = false;
        {
          std::lock_guard<std::mutex> lock(mu_);
          broken = aborted_ || !error_.empty();
        }
        if (broken) continue;  // a failed or aborted device runs nothing more (as a CUDA context)
        try {
          execute(s, c);
        } catch (const std::exception& e) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (error_.empty()) error_ = e.what();
          }
          cv_.notify_all();
        }
      }
    });
    workers_.emplace(s, std::move(w));
  }
  for (const CommSpec& c : setup.comms) {
    Comm comm;
    comm.key = c.name() + "/" + id_text(c.id);
    comm.size = static_cast<int>(c.members.size());
    comm.index = c.index;
    comm.members = c.members;
    if (c.p2p) {
      p2p_comms_[c.key] = comm;
    } else {
      comms_[{static_cast<int>(c.group), c.stream}] = comm;
    }
  }
  prepare(*setup.graph, cls);
}

void FakeDevice::prepare(const scenarios::StepGraph& /*graph*/, const scenarios::RankClass& cls) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Op& op : cls.ops) {
    if (op.kind == OpKind::host) continue;
    double& b = stream_bytes_[op.stream];
    b = std::max(b, op.bytes);
  }
}

std::size_t FakeDevice::memory_in_use() {
  std::lock_guard<std::mutex> lock(mu_);
  double total = 0.0;
  for (const auto& [s, b] : stream_bytes_) total += b;
  return static_cast<std::size_t>(total) + segment_bytes_;
}

void* FakeDevice::allocate_segment(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::size_t limit = fabric_.options().memory_bytes;
  if (limit > 0 && segment_bytes_ + bytes > limit) return nullptr;
  segment_bytes_ += bytes;
  const std::uintptr_t at = next_segment_;
  next_segment_ += bytes + 4096;
  return reinterpret_cast<void*>(at);
}

void FakeDevice::free_segment(void* /*p*/, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  segment_bytes_ -= bytes;
}

std::uint32_t FakeDevice::index_of(const scenarios::StepGraph& g, const Op& op) const {
  const auto& ops = g.class_of(rank_).ops;
  if (ops.empty() || &op < ops.data() || &op >= ops.data() + ops.size()) return 0xffffffffU;
  return static_cast<std::uint32_t>(&op - ops.data());
}

double FakeDevice::duration_us(const Op& op) const {
  const FakeDeviceOptions& o = fabric_.options();
  double us = 0.0;
  if (op.is_comm()) {
    us = op.bytes / o.link_bytes_per_us;
  } else if (op.wall == scenarios::Wall::compute) {
    us = op.flops / o.flops_per_us;
  } else {
    us = op.bytes / o.bytes_per_us;
  }
  return std::clamp(us, o.min_op_us, o.max_op_us);
}

bool FakeDevice::blocks_host(const Op& op) const {
  return op.kind == OpKind::copy && op.copy_kind() == scenarios::CopyKind::disk_read;
}

std::uint32_t FakeDevice::new_slot(bool marker, bool pinned) {
  // mu_ held by the caller
  // A released slot is reused only once its last record has completed, so a wait enqueued before
  // the release is never satisfied by a later record of the same slot.
  std::vector<std::uint32_t>& pool = marker ? free_markers_ : free_events_;
  if (!pinned) {
    for (std::size_t i = pool.size(); i-- > 0;) {
      const std::uint32_t id = pool[i];
      if (slots_[id].completed >= slots_[id].recorded) {
        pool[i] = pool.back();
        pool.pop_back();
        slots_[id].released = false;
        return id;
      }
    }
  }
  Slot s;
  s.marker = marker;
  s.pinned = pinned;
  slots_.push_back(s);
  return static_cast<std::uint32_t>(slots_.size() - 1);
}

std::size_t FakeDevice::slots_created() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.size();
}

void FakeDevice::enqueue(int stream, Cmd c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (capturing_) {
      capture_.cmds.emplace_back(stream, c);
      if (std::find(capture_.streams.begin(), capture_.streams.end(), stream) == capture_.streams.end()) {
        capture_.streams.push_back(stream);
      }
      return;
    }
    if (c.kind == CmdKind::record) c.generation = ++slots_[c.slot].recorded;
    if (c.kind == CmdKind::wait) c.generation = slots_[c.slot].recorded;
  }
  StreamWorker& w = worker(stream);
  const auto depth = static_cast<std::size_t>(std::max(0, fabric_.options().launch_queue_depth));
  {
    std::unique_lock<std::mutex> lock(w.mu);
    while (depth > 0 && w.queue.size() >= depth) {
      w.cv.wait_for(lock, std::chrono::milliseconds(5));
      if (w.queue.size() < depth) break;
      lock.unlock();
      const bool stop = stopping();
      lock.lock();
      if (stop) return;  // an aborted device runs nothing more: the launch returns, dropped
    }
    w.queue.push_back(c);
  }
  w.cv.notify_all();
}

void FakeDevice::count_launch(const scenarios::StepGraph& graph, const Op& op) {
  if (setup_.rank != fabric_.options().fail_rank || fabric_.options().fail_at_launch <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (++launches_ == fabric_.options().fail_at_launch) {
    throw SystemError("rank " + std::to_string(rank_) + ": fake device: injected failure at launch " +
                      std::to_string(launches_) + " (" + op_text(graph, op) + ")");
  }
}

void FakeDevice::launch_p2p_group(const scenarios::StepGraph& graph, const std::vector<const Op*>& ops, int stream,
                                  bool /*annotate*/) {
  for (const Op* op : ops) count_launch(graph, *op);
  Cmd c;
  c.kind = CmdKind::p2p_group;
  c.graph = &graph;
  c.group = ops;
  enqueue(stream, c);
}

void FakeDevice::launch(const scenarios::StepGraph& graph, const Op& op, int stream, bool /*annotate*/) {
  count_launch(graph, op);
  Cmd c;
  c.kind = CmdKind::op;
  c.graph = &graph;
  c.op = &op;
  c.op_index = index_of(graph, op);
  if (blocks_host(op)) {  // a disk read: on the calling thread
    // As CudaDevice: the read uses its stream's OpRunner (pinned buffer, file), so the stream must
    // have been opened even though nothing is queued on it.
    static_cast<void>(worker(stream));
    const double t0 = fabric_.now_us();
    std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(duration_us(op)));
    fabric_.add_trace(FakeTraceEntry{rank_, c.op_index, stream, t0, fabric_.now_us(), false});
    return;
  }
  if (fabric_.options().launch_host_us > 0.0) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(fabric_.options().launch_host_us));
  }
  enqueue(stream, c);
}

std::uint32_t FakeDevice::record_event(int stream) {
  std::uint32_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = new_slot(false, false);
  }
  Cmd c;
  c.kind = CmdKind::record;
  c.slot = id;
  enqueue(stream, c);
  return id;
}

void FakeDevice::wait_event(int stream, std::uint32_t event) {
  Cmd c;
  c.kind = CmdKind::wait;
  c.slot = event;
  enqueue(stream, c);
}

bool FakeDevice::event_done(std::uint32_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_[event].completed >= slots_[event].recorded;
}

bool FakeDevice::wait_event_host(std::uint32_t event, std::chrono::microseconds max_wait) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, max_wait, [&] {
    return slots_[event].completed >= slots_[event].recorded || aborted_ || !error_.empty();
  }) && slots_[event].completed >= slots_[event].recorded;
}

void FakeDevice::release_event(std::uint32_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!slots_[event].pinned) free_events_.push_back(event);
}

std::uint32_t FakeDevice::record_marker(int stream) {
  std::uint32_t id = 0;
  bool capturing = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = new_slot(true, capturing_);
    capturing = capturing_;
  }
  if (!capturing) fabric_.count_marker();
  Cmd c;
  c.kind = CmdKind::record;
  c.slot = id;
  enqueue(stream, c);
  return id;
}

bool FakeDevice::marker_done(std::uint32_t marker) { return event_done(marker); }

double FakeDevice::elapsed_us(std::uint32_t from, std::uint32_t to) {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_[to].time_us - slots_[from].time_us;
}

void FakeDevice::release_marker(std::uint32_t marker) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_.at(marker);
  if (s.pinned) return;  // a graph's marker: replayed, never recycled
  // A marker released twice would sit twice in the pool and be handed to two owners at once (their
  // timestamps overwriting each other): a bug in the caller, caught here (CudaDevice cannot tell).
  if (s.released) {
    throw SystemError("rank " + std::to_string(rank_) + ": fake device: timing marker " + std::to_string(marker) +
                      " released twice");
  }
  s.released = true;
  free_markers_.push_back(marker);
}

void FakeDevice::host_read(int /*stream*/) {
  // The executor waited for the stream; the read itself is a few microseconds.
  std::this_thread::sleep_for(std::chrono::microseconds(5));
}

void FakeDevice::host_work(const Op& op) {
  const double ns = static_cast<double>(op.shape[0]) * fabric_.options().host_work_scale;
  if (ns > 0.0) std::this_thread::sleep_for(std::chrono::duration<double, std::nano>(ns));
}

void FakeDevice::begin_capture(int origin) {
  std::lock_guard<std::mutex> lock(mu_);
  if (capturing_) throw SystemError("rank " + std::to_string(rank_) + ": fake device: nested capture");
  capturing_ = true;
  capture_origin_ = origin;
  capture_ = Graph();
  capture_.streams.push_back(origin);
}

std::uint32_t FakeDevice::end_capture(int origin) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!capturing_ || origin != capture_origin_) {
    throw SystemError("rank " + std::to_string(rank_) + ": fake device: end_capture without a matching begin_capture");
  }
  capturing_ = false;
  // Events recorded inside the capture become the graph's own (the executor recycles its ids).
  std::map<std::uint32_t, std::uint32_t> remap;
  for (auto& [s, c] : capture_.cmds) {
    if (c.kind == CmdKind::record && !slots_[c.slot].pinned) {
      if (remap.count(c.slot) == 0) remap[c.slot] = new_slot(false, true);
    }
  }
  for (auto& [s, c] : capture_.cmds) {
    const auto it = remap.find(c.slot);
    if ((c.kind == CmdKind::record || c.kind == CmdKind::wait) && it != remap.end()) c.slot = it->second;
    if (c.kind == CmdKind::op || c.kind == CmdKind::p2p_group) c.in_graph = true;
  }
  graphs_.push_back(std::move(capture_));
  capture_ = Graph();
  return static_cast<std::uint32_t>(graphs_.size() - 1);
}

void FakeDevice::launch_graph(std::uint32_t graph, int origin) {
  Graph g;
  std::uint32_t start = 0;
  std::vector<std::uint32_t> tails;
  {
    std::lock_guard<std::mutex> lock(mu_);
    g = graphs_.at(graph);
    start = new_slot(false, false);
    for (std::size_t i = 1; i < g.streams.size(); ++i) tails.push_back(new_slot(false, false));
  }
  // The graph is one unit ordered on `origin`: its other streams start after, and end before, it.
  Cmd rec;
  rec.kind = CmdKind::record;
  rec.slot = start;
  enqueue(origin, rec);
  for (std::size_t i = 1; i < g.streams.size(); ++i) {
    Cmd w;
    w.kind = CmdKind::wait;
    w.slot = start;
    enqueue(g.streams[i], w);
  }
  for (const auto& [s, c] : g.cmds) enqueue(s, c);
  for (std::size_t i = 1; i < g.streams.size(); ++i) {
    Cmd r;
    r.kind = CmdKind::record;
    r.slot = tails[i - 1];
    enqueue(g.streams[i], r);
    Cmd w;
    w.kind = CmdKind::wait;
    w.slot = tails[i - 1];
    enqueue(origin, w);
  }
  std::lock_guard<std::mutex> lock(mu_);
  free_events_.push_back(start);  // every wait on them is enqueued
  for (std::uint32_t t : tails) free_events_.push_back(t);
}

void FakeDevice::poll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty()) throw SystemError(error_);
}

void FakeDevice::abort() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
  }
  cv_.notify_all();
  fabric_.wake_all();
}

void FakeDevice::execute(int stream, const Cmd& c) {
  switch (c.kind) {
    case CmdKind::record: {
      {
        std::lock_guard<std::mutex> lock(mu_);
        Slot& s = slots_[c.slot];
        s.completed = std::max(s.completed, c.generation);
        s.time_us = fabric_.now_us();
      }
      cv_.notify_all();
      return;
    }
    case CmdKind::wait: {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return slots_[c.slot].completed >= c.generation || aborted_; });
      return;
    }
    case CmdKind::op: run_op(stream, c); return;
    case CmdKind::p2p_group: run_p2p_group(stream, c); return;
  }
}

std::pair<std::string, int> FakeDevice::meeting_of(int stream, const Cmd& c, const Op& op, FakeFabric::Arrival& me) {
  me.rank = rank_;
  me.duration_us = duration_us(op);
  if (op.kind == OpKind::collective) {
    const auto it = comms_.find({static_cast<int>(op.group), stream});
    if (it == comms_.end()) {
      throw SystemError("rank " + std::to_string(rank_) + ": fake device: no communicator for group " +
                        scenarios::to_string(op.group) + " on stream " + std::to_string(stream) + " (" +
                        op_text(*c.graph, op) + ")");
    }
    Comm& comm = it->second;
    me.what = op_text(*c.graph, op);
    return {comm.key + " collective #" + std::to_string(comm.seq++), comm.size};
  }
  const std::string key = comm_key(*c.graph, rank_, op);
  const auto it = p2p_comms_.find(key);
  if (it == p2p_comms_.end()) {
    throw SystemError("rank " + std::to_string(rank_) + ": fake device: no communicator " + key + " (" +
                      op_text(*c.graph, op) + ")");
  }
  Comm& comm = it->second;
  const int peer = 1 - comm.index;  // a two-rank communicator
  const bool send = op.kind == OpKind::send;
  const int src = send ? comm.index : peer;
  const int dst = send ? peer : comm.index;
  const std::uint64_t n = comm.p2p[{peer, send ? 1 : 0}]++;
  me.what = "a transfer of tag " + std::to_string(op.tag) + " (" + std::to_string(static_cast<long long>(op.bytes)) +
            " bytes)";
  me.awaits = !(send && op.bytes <= fabric_.options().p2p_eager_bytes);
  return {comm.key + " p2p " + std::to_string(src) + ">" + std::to_string(dst) + " #" + std::to_string(n), 2};
}

// A hung peer (test fault): its n-th communication never arrives and raises nothing. Returns true
// when this op is the one (the caller then drops it once the device is aborted).
#define TW_FAKE_HANG_CHECK()                                                                   \
  do {                                                                                         \
    std::unique_lock<std::mutex> lock(mu_);                                                    \
    ++comm_ops_;                                                                               \
    if (rank_ == fabric_.options().hang_rank && comm_ops_ == fabric_.options().hang_at_comm) { \
      cv_.wait(lock, [&] { return aborted_; });                                                \
      return;                                                                                  \
    }                                                                                          \
  } while (0)

void FakeDevice::run_p2p_group(int stream, const Cmd& c) {
  const double t0 = fabric_.now_us();
  std::vector<std::pair<std::string, bool>> keys;
  for (const Op* op : c.group) {
    TW_FAKE_HANG_CHECK();
    FakeFabric::Arrival me;
    const auto [key, size] = meeting_of(stream, c, *op, me);
    fabric_.arrive(key, size, me);
    keys.emplace_back(key, me.awaits);
  }
  // Members progress independently; the group ends when all have.
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].second) {
      if (!fabric_.await(keys[i].first, [this] { return stopping(); })) return;
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(duration_us(*c.group[i])));
    }
  }
  const double t1 = fabric_.now_us();
  for (const Op* op : c.group) fabric_.add_trace(FakeTraceEntry{rank_, index_of(*c.graph, *op), stream, t0, t1, c.in_graph});
}

void FakeDevice::run_op(int stream, const Cmd& c) {
  const Op& op = *c.op;
  const double t0 = fabric_.now_us();
  if (op.is_comm()) {
    TW_FAKE_HANG_CHECK();
    FakeFabric::Arrival me;
    const auto [key, size] = meeting_of(stream, c, op, me);
    fabric_.arrive(key, size, me);
    if (me.awaits) {
      if (!fabric_.await(key, [this] { return stopping(); })) return;
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(me.duration_us));
    }
  } else {
    std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(duration_us(op)));
  }
  fabric_.add_trace(FakeTraceEntry{rank_, c.op_index, stream, t0, fabric_.now_us(), c.in_graph});
}

}  // namespace threewalls::backend
