#include "threewalls/backend/cuda_device.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include "threewalls/backend/error.hpp"
#include "threewalls/backend/executor.hpp"
#include "threewalls/backend/host_speed.hpp"
#include "threewalls/backend/kernels.hpp"
#include "threewalls/core/host_probe.hpp"

namespace threewalls::backend {

using scenarios::Op;
using scenarios::OpKind;
using SteadyClock = std::chrono::steady_clock;

namespace {

static_assert(sizeof(ncclUniqueId) <= sizeof(CommId::bytes), "CommId must hold an ncclUniqueId");

std::size_t p2p_elems(double bytes) { return static_cast<std::size_t>(std::max(1.0, std::floor(bytes / 2.0))); }

}  // namespace

CudaDevice::Binder::Binder(int rank, int ordinal) {
  set_thread_rank(rank);
  set_device(ordinal);
}

CudaDevice::CudaDevice(int rank, int ordinal) : binder_(rank, ordinal), rank_(rank), ordinal_(ordinal) {}

CudaDevice::~CudaDevice() {
  // Nothing may wait on a peer that is gone: after an abort the communicators are already freed.
  if (!aborted_) {
    for (auto& [s, ps] : streams_) static_cast<void>(cudaStreamSynchronize(ps.stream));
  }
}

std::string CudaDevice::name() const { return device_name(); }

std::string CudaDevice::memory_method() const {
  return "cudaMemGetInfo (total - free) high-water mark, sampled after setup and at every step boundary; "
         "device-wide: includes the CUDA context, cuBLAS workspaces, NCCL buffers and graph memory (the executor "
         "allocates nothing while steps run)";
}

OrderedJson CudaDevice::settings() const {
  OrderedJson j = OrderedJson::object();
  int rt = 0;
  int drv = 0;
  static_cast<void>(cudaRuntimeGetVersion(&rt));
  static_cast<void>(cudaDriverGetVersion(&drv));
  j["kind"] = "cuda";
  j["cuda_runtime"] = std::to_string(rt / 1000) + "." + std::to_string((rt % 1000) / 10);
  j["cuda_driver"] = std::to_string(drv / 1000) + "." + std::to_string((drv % 1000) / 10);
  j["nccl"] = nccl_version();
  j["ordinal"] = ordinal_;
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  j["cuda_device_max_connections"] = connections != nullptr ? std::string(connections) : std::string("unset (8)");
  OrderedJson streams = OrderedJson::object();
  for (const auto& [s, ps] : streams_) {
    int prio = 0;
    static_cast<void>(cudaStreamGetPriority(ps.stream, &prio));
    streams[setup_.graph->streams[static_cast<std::size_t>(s)].name] = prio;
  }
  j["stream_priorities"] = streams;
  OrderedJson comms = OrderedJson::array();
  for (const CommSpec& c : setup_.comms) comms.push_back(c.name());
  j["communicators"] = comms;
  j["communicator_mode"] = "non-blocking (ncclConfig_t::blocking = 0), errors polled with ncclCommGetAsyncError";
  j["op_runner"] = "one per stream (own cuBLASLt handle and workspace, own CommTable)";
  j["graph_capture"] = "cudaStreamCaptureModeThreadLocal; timed copies carry cudaEventRecordExternal nodes";
  j["memory_measurement"] = memory_method();
  if (!host_probe_.is_null()) j["host_probe"] = host_probe_;
  return j;
}

CudaDevice::PerStream& CudaDevice::at(int stream) {
  const auto it = streams_.find(stream);
  if (it == streams_.end()) {
    throw SystemError(rank_prefix() + "stream " + std::to_string(stream) + " was not created by open()");
  }
  return it->second;
}

void CudaDevice::open(const DeviceSetup& setup, const scenarios::RankClass& cls) {
  setup_ = setup;
  int least = 0;
  int greatest = 0;
  TW_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  for (int s : setup.streams) {
    const auto kind = setup.graph->streams[static_cast<std::size_t>(s)].kind;
    // Communication streams get the highest priority so collectives are not starved by compute
    // kernels (as Megatron-Core and NCCL users do).
    PerStream ps{Stream(kind == scenarios::StreamKind::communication ? greatest : least), std::make_unique<CommTable>(),
                 nullptr, DeviceBuffer(), DeviceBuffer(), {}};
    streams_.emplace(s, std::move(ps));
  }
  create_comms();
  prepare(*setup.graph, cls);
  probe_host();
}

// The host's speed in this process: launch-bound steps on a VM differ by 20-70% from one
// process to the next while the steps inside a process agree within a few percent, and a
// calibration taken in another process does not see it (docs/validation/host_overhead.md). So
// every run measures, after its buffers are prepared and before its first step, three host costs
// the calibration measures the same way (its host.kernel_launch + host.op_dispatch, and two
// host.gemm_call grid shapes, one node and split over K): OpRunner::run on its own runner and
// stream, the device idle, kProbeCalls calls per sample, the median of kProbeSamples samples.
// run.json keeps them (settings.executor.device.host_probe); the simulator can scale the profile's
// host costs by them (threewalls sim --host-scale, scripts/validate_suite.py). Then the CPU alone
// (measure_cpu_speed). About 25 ms.
void CudaDevice::probe_host() {
  constexpr int kProbeCalls = 32;
  constexpr int kProbeSamples = 7;
  OpRunner runner(OpRunnerConfig{});
  const Stream stream;
  Op add;
  add.kind = OpKind::elementwise;
  add.sub = static_cast<std::uint8_t>(scenarios::ElementwiseKind::add);
  add.shape = {host_probe::kAddElements, 0, 0, 0, 0, 0};
  auto gemm = [](std::int64_t m, std::int64_t n, std::int64_t k) {
    Op g;
    g.kind = OpKind::gemm;
    g.shape = {m, n, k, 1, 0, 0};
    g.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    return g;
  };
  std::vector<std::pair<std::string, Op>> probes{{std::string(host_probe::kOpLaunchKey), add}};
  for (const auto& g : host_probe::kGemmCalls) probes.emplace_back(std::string(g.key), gemm(g.m, g.n, g.k));
  std::vector<Op> ops;
  for (const auto& [name, op] : probes) ops.push_back(op);
  runner.prepare(ops);
  OrderedJson j = OrderedJson::object();
  for (const auto& [name, op] : probes) {
    runner.run(op, stream.get());
    TW_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    std::vector<double> samples;
    for (int i = 0; i < kProbeSamples; ++i) {
      const auto t0 = SteadyClock::now();
      for (int c = 0; c < kProbeCalls; ++c) runner.run(op, stream.get());
      samples.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count() / kProbeCalls);
      TW_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    }
    std::sort(samples.begin(), samples.end());
    j[name] = samples[samples.size() / 2];
  }
  // The CPU alone, right after (host_speed.hpp): is the CPU slower too when the calls are?
  const CpuSpeed cpu = measure_cpu_speed();
  j["cpu_chain_us"] = cpu.chain_us;
  j["cpu_copy_GBps"] = cpu.copy_GBps;
  j["cpu_load_ns"] = cpu.load_ns;
  j["method"] = "OpRunner::run host time per call, " + std::to_string(kProbeCalls) + " calls back to back on an idle "
                "device, median of " + std::to_string(kProbeSamples) + " samples, after the buffers were prepared; "
                "cpu_chain_us: " + std::to_string(kChainSteps) + " dependent multiply-xor steps, cpu_copy_GBps: a "
                "16 MiB memcpy, cpu_load_ns: a dependent load of a random walk through 32 MiB (backend/host_speed.hpp)";
  host_probe_ = std::move(j);
}

void CudaDevice::create_comms() {
  struct Pending {
    const CommSpec* spec;
    NcclComm comm;
  };
  std::vector<Pending> pending;
  auto abort_all = [&] {
    for (Pending& p : pending) p.comm.abort();
  };
  for (const CommSpec& spec : setup_.comms) {
    ncclUniqueId id{};
    std::memcpy(&id, spec.id.bytes.data(), sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c = nullptr;
    const ncclResult_t r =
        ncclCommInitRankConfig(&c, static_cast<int>(spec.members.size()), id, spec.index, &config);
    pending.push_back(Pending{&spec, NcclComm(c, scenarios::to_string(spec.group), spec.index,
                                              static_cast<int>(spec.members.size()), setup_.timeout)});
    if (r != ncclSuccess && r != ncclInProgress) {
      abort_all();
      throw DeviceError(rank_prefix() + "ncclCommInitRankConfig for communicator " + spec.name() + " (member " +
                        std::to_string(spec.index) + " of " + std::to_string(spec.members.size()) + ") failed at " +
                        __FILE__ + ":" + std::to_string(__LINE__) + ": " + ncclGetErrorString(r));
    }
  }
  // Every init was started before any is awaited, so ranks listing communicators in different orders
  // cannot deadlock.
  const auto start = SteadyClock::now();
  std::vector<bool> ready(pending.size(), false);
  for (;;) {
    bool all = true;
    for (std::size_t i = 0; i < pending.size(); ++i) {
      if (ready[i]) continue;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(pending[i].comm.get(), &state);
      if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
        const char* last = ncclGetLastError(pending[i].comm.get());
        abort_all();
        throw DeviceError(rank_prefix() + "creating NCCL communicator " + pending[i].spec->name() + " failed: " +
                          ncclGetErrorString(r != ncclSuccess ? r : state) +
                          (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : std::string()) +
                          "; communicators aborted");
      }
      if (state == ncclSuccess) {
        ready[i] = true;
      } else {
        all = false;
      }
    }
    if (all) break;
    if (setup_.stop_requested && setup_.stop_requested()) {
      abort_all();
      throw SystemError(rank_prefix() + "stopped while creating NCCL communicators (another rank failed)");
    }
    if (SteadyClock::now() - start > setup_.timeout) {
      abort_all();
      throw DeviceError(rank_prefix() + "creating NCCL communicators timed out after " +
                        std::to_string(setup_.timeout.count() / 1000.0) +
                        " s (a member rank never joined); communicators aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (Pending& p : pending) {
    if (p.spec->p2p) {
      p2p_comms_.emplace(p.spec->key, std::move(p.comm));
      continue;
    }
    PerStream& ps = at(p.spec->stream);
    ps.comm_names[p.spec->group] = p.spec->name();
    ps.comms->add(p.spec->group, std::move(p.comm));
  }
}

void CudaDevice::prepare(const scenarios::StepGraph& graph, const scenarios::RankClass& cls) {
  std::map<int, std::vector<Op>> by_stream;
  std::map<int, std::size_t> send_bytes;
  std::map<int, std::size_t> recv_bytes;
  for (const Op& op : cls.ops) {
    if (op.kind == OpKind::host) continue;
    if (op.kind == OpKind::send || op.kind == OpKind::recv) {
      auto& m = op.kind == OpKind::send ? send_bytes : recv_bytes;
      m[op.stream] = std::max(m[op.stream], 2 * p2p_elems(op.bytes));
      continue;
    }
    std::vector<Op>& ops = by_stream[op.stream];
    ops.push_back(op);
    if (op.kind == OpKind::collective && op.collective() == scenarios::Collective::all_to_all && op.shape[1] != 0) {
      // A routed all-to-all may receive more than it sends (the hot EP rank): size the buffers for
      // the larger side with an all-reduce of that many bytes (OpRunner sizes collectives by bytes).
      PerStream& ps = at(op.stream);
      const int index = ps.comms->has(op.group) ? ps.comms->comm(op.group).index() : 0;
      std::vector<std::size_t> sb;
      std::vector<std::size_t> rb;
      all_to_all_split(op, op.group_size, index, setup_.routing_imbalance, sb, rb);
      std::size_t st = 0;
      std::size_t rt = 0;
      for (std::size_t v : sb) st += v;
      for (std::size_t v : rb) rt += v;
      Op sizing = op;
      sizing.sub = static_cast<std::uint8_t>(scenarios::Collective::all_reduce);
      sizing.bytes = static_cast<double>(std::max(st, rt)) + 64.0;
      sizing.shape = {};
      ops.push_back(sizing);
    }
  }
  static_cast<void>(graph);
  if (setup_.parameter_weight_bytes > 0 && !parameter_state_) {
    // The rank's parameter state, before the runners that share it (parameter_state.hpp).
    std::vector<Op> all;
    for (const auto& [s, ops] : by_stream) all.insert(all.end(), ops.begin(), ops.end());
    parameter_state_ = std::make_unique<ParameterState>(
        all, setup_.parameter_weight_bytes, setup_.parameter_gradient_bytes,
        setup_.seed + static_cast<std::uint64_t>(rank_), setup_.kv_cache_bytes_per_layer);
  }
  for (auto& [s, ops] : by_stream) prepare_stream(s, ops);
  for (auto& [s, b] : send_bytes) {
    PerStream& ps = at(s);
    if (ps.p2p_send.size() < b) {
      ps.p2p_send = DeviceBuffer(b);
      fill_random(ps.p2p_send.as<bf16>(), static_cast<std::int64_t>(b / 2),
                  setup_.seed * 1000003ULL + static_cast<std::uint64_t>(rank_) * 7919ULL + static_cast<std::uint64_t>(s),
                  1.0F, ps.stream);
    }
  }
  for (auto& [s, b] : recv_bytes) {
    PerStream& ps = at(s);
    if (ps.p2p_recv.size() < b) ps.p2p_recv = DeviceBuffer(b);
  }
  TW_CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaDevice::prepare_stream(int s, const std::vector<Op>& ops) {
  PerStream& ps = at(s);
  if (!ps.runner) {
    OpRunnerConfig cfg;
    cfg.seed = setup_.seed * 1000003ULL + static_cast<std::uint64_t>(rank_) * 7919ULL + static_cast<std::uint64_t>(s);
    const bool attention = std::any_of(ops.begin(), ops.end(), [](const Op& op) { return op.kind == OpKind::attention; });
    cfg.attention_workspace = attention ? Attention::kDefaultWorkspace : 0;
    if (setup_.num_experts > 0) cfg.route_experts = std::min(setup_.num_experts, 1024);
    cfg.parameter_state = parameter_state_.get();
    ps.runner = std::make_unique<OpRunner>(cfg, ps.comms.get());
    CommTable* table = ps.comms.get();
    const double imbalance = setup_.routing_imbalance;
    ps.runner->set_all_to_all_split([table, imbalance](const Op& op, int group_size, std::vector<std::size_t>& sb,
                                                       std::vector<std::size_t>& rb) {
      all_to_all_split(op, group_size, table->comm(op.group).index(), imbalance, sb, rb);
    });
  }
  ps.runner->prepare(ops);
}

const nvtx3::registered_string_in<profiler::cuda::NvtxDomain>& CudaDevice::nvtx_name(const scenarios::StepGraph& g,
                                                                                      const Op& op) {
  auto& names = nvtx_by_graph_[&g];
  if (names.empty()) {
    for (const std::string& p : g.phases) names.push_back(&nvtx_.get(p));
  }
  return *names[op.phase];
}

void CudaDevice::launch(const scenarios::StepGraph& graph, const Op& op, int stream, bool annotate) {
  PerStream& ps = at(stream);
  const profiler::cuda::NvtxScope range = annotate ? profiler::cuda::NvtxScope(nvtx_name(graph, op), op.layer, true)
                                                   : profiler::cuda::NvtxScope();
  if (op.kind == OpKind::send || op.kind == OpKind::recv) {
    p2p(graph, op, ps);
    return;
  }
  if (!ps.runner) throw SystemError(rank_prefix() + "no OpRunner prepared for stream " + std::to_string(stream));
  ps.runner->run(op, ps.stream);
}

void CudaDevice::launch_p2p_group(const scenarios::StepGraph& graph, const std::vector<const Op*>& ops, int stream,
                                  bool annotate) {
  PerStream& ps = at(stream);
  if (ops.empty()) return;
  const profiler::cuda::NvtxScope range = annotate ? profiler::cuda::NvtxScope(nvtx_name(graph, *ops.front()),
                                                                              ops.front()->layer, true)
                                                   : profiler::cuda::NvtxScope();
  NcclComm& comm = p2p_comm(graph, *ops.front());
  comm.check(ncclGroupStart(), "ncclGroupStart()", __FILE__, __LINE__);
  for (const Op* op : ops) p2p(graph, *op, ps);
  comm.check(ncclGroupEnd(), "ncclGroupEnd()", __FILE__, __LINE__);
}

NcclComm& CudaDevice::p2p_comm(const scenarios::StepGraph& graph, const Op& op) {
  const std::string key = comm_key(graph, rank_, op);
  const auto it = p2p_comms_.find(key);
  if (it == p2p_comms_.end()) {
    throw SystemError(rank_prefix() + "no NCCL communicator " + key + " for " + graph.phase_name(op) +
                      " (open() was not given it)");
  }
  return it->second;
}

void CudaDevice::p2p(const scenarios::StepGraph& graph, const Op& op, PerStream& ps) {
  NcclComm& comm = p2p_comm(graph, op);
  const int peer = 1 - comm.index();  // a two-rank communicator: the other member
  const std::size_t elems = p2p_elems(op.bytes);
  if (op.kind == OpKind::send) {
    send(ps.p2p_send.data(), elems, peer, comm, ps.stream);
  } else {
    recv(ps.p2p_recv.data(), elems, peer, comm, ps.stream);
  }
}

std::uint32_t CudaDevice::record_event(int stream) {
  std::uint32_t id = 0;
  if (!free_events_.empty()) {
    id = free_events_.back();
    free_events_.pop_back();
  } else {
    events_.emplace_back(false);  // synchronisation only: cudaEventDisableTiming
    id = static_cast<std::uint32_t>(events_.size() - 1);
  }
  TW_CUDA_CHECK(cudaEventRecord(events_[id].get(), at(stream).stream));
  return id;
}

void CudaDevice::wait_event(int stream, std::uint32_t event) {
  TW_CUDA_CHECK(cudaStreamWaitEvent(at(stream).stream, events_[event].get(), 0));
}

bool CudaDevice::event_done(std::uint32_t event) { return events_[event].done(); }

bool CudaDevice::wait_event_host(std::uint32_t event, std::chrono::microseconds max_wait) {
  // Spin with yields: host waits are what the StepGraph's host ops measure, so wake-up latency
  // matters more than the core (the rank thread has nothing else to do).
  const auto end = SteadyClock::now() + max_wait;
  for (;;) {
    if (events_[event].done()) return true;
    if (SteadyClock::now() >= end) return false;
    std::this_thread::yield();
  }
}

void CudaDevice::release_event(std::uint32_t event) { free_events_.push_back(event); }

std::uint32_t CudaDevice::record_marker(int stream) {
  return capturing_ ? clock_.mark_pinned(at(stream).stream).id : clock_.mark(at(stream).stream).id;
}
bool CudaDevice::marker_done(std::uint32_t marker) { return clock_.done({marker}); }
double CudaDevice::elapsed_us(std::uint32_t from, std::uint32_t to) { return clock_.elapsed_us({from}, {to}); }
void CudaDevice::release_marker(std::uint32_t marker) { clock_.release({marker}); }

void CudaDevice::host_read(int stream) {
  PerStream& ps = at(stream);
  if (!ps.runner) throw SystemError(rank_prefix() + "no OpRunner on stream " + std::to_string(stream) + " for a gpu_read");
  ps.runner->gpu_read(ps.stream);
}

void CudaDevice::host_work(const Op& op) {
  // Framework overhead is CPU work: keep the host thread busy for the hint.
  const auto end = SteadyClock::now() + std::chrono::nanoseconds(std::max<std::int64_t>(op.shape[0], 0));
  while (SteadyClock::now() < end) {
  }
}

bool CudaDevice::blocks_host(const Op& op) const {
  return op.kind == OpKind::copy && op.copy_kind() == scenarios::CopyKind::disk_read;
}

void CudaDevice::begin_capture(int origin) {
  // Thread-local mode: other rank threads may still be allocating on their own devices.
  TW_CUDA_CHECK(cudaStreamBeginCapture(at(origin).stream, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
}

std::uint32_t CudaDevice::end_capture(int origin) {
  capturing_ = false;
  cudaGraph_t g = nullptr;
  TW_CUDA_CHECK(cudaStreamEndCapture(at(origin).stream, &g));
  graphs_.emplace_back(g);
  execs_.emplace_back(graphs_.back());
  return static_cast<std::uint32_t>(execs_.size() - 1);
}

void CudaDevice::launch_graph(std::uint32_t graph, int origin) { execs_.at(graph).launch(at(origin).stream); }

void CudaDevice::poll() {
  // A communicator that reports an asynchronous error aborts them all and fails this rank.
  auto check = [this](NcclComm& comm, const std::string& name) {
    if (comm.aborted()) return;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm.get(), &state);
    if (r == ncclSuccess && (state == ncclSuccess || state == ncclInProgress)) return;
    const char* last = ncclGetLastError(comm.get());
    const std::string why = ncclGetErrorString(r != ncclSuccess ? r : state);
    abort();
    throw DeviceError(rank_prefix() + "NCCL communicator " + name + ": asynchronous error: " + why +
                      (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : std::string()) +
                      "; communicators aborted");
  };
  for (auto& [key, comm] : p2p_comms_) check(comm, key);
  for (auto& [s, ps] : streams_) {
    for (const auto& [group, name] : ps.comm_names) check(ps.comms->comm(group), name);
  }
}

void CudaDevice::abort() noexcept {
  if (aborted_.exchange(true)) return;
  std::vector<NcclComm*> all;
  bool collected = true;
  try {
    for (auto& [key, comm] : p2p_comms_) all.push_back(&comm);
    for (auto& [s, ps] : streams_) {
      if (ps.comms) ps.comms->collect(all);
    }
  } catch (...) {
    collected = false;  // out of memory for a few pointers: those collected go first, the rest after
  }
  abort_together(all);  // every communicator of this GPU at once (abort_together says why)
  if (collected) return;
  for (auto& [key, comm] : p2p_comms_) comm.abort();
  for (auto& [s, ps] : streams_) {
    if (ps.comms) ps.comms->abort_all();
  }
}

std::size_t CudaDevice::memory_in_use() {
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  TW_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return total - free_bytes;
}

void* CudaDevice::allocate_segment(std::size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    static_cast<void>(cudaGetLastError());  // clear the sticky-free error state of this call
    return nullptr;
  }
  TW_CUDA_CHECK(err);
  return p;
}

void CudaDevice::free_segment(void* p, std::size_t /*bytes*/) { TW_CUDA_CHECK(cudaFree(p)); }

}  // namespace threewalls::backend
