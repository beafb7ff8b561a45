#include "threewalls/sim/executor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "threewalls/core/error.hpp"
#include "threewalls/profiler/record.hpp"
#include "threewalls/scenarios/layout.hpp"

namespace threewalls::sim {

const char* to_string(Fidelity f) { return f == Fidelity::flow ? "flow" : "analytic"; }

ExpertDispatch expert_dispatch_of(const scenarios::Scenario& s) {
  ExpertDispatch d;
  const scenarios::ExecOptions* exec = s.train ? &s.train->exec : (s.infer ? &s.infer->exec : nullptr);
  d.kind = exec != nullptr && exec->token_dispatcher == scenarios::Dispatcher::flex ? DispatchKind::flex
                                                                                    : DispatchKind::alltoall;
  d.num_experts = s.model.num_experts;
  d.topk = s.model.moe_router_topk;
  d.num_groups = s.model.moe_router_num_groups;
  d.group_topk = s.model.moe_router_group_topk;
  return d;
}

ExecutorOptions executor_options_of(const scenarios::Scenario& s) {
  ExecutorOptions eo;
  eo.routing_imbalance = s.train ? s.train->routing_imbalance : 1.0;
  eo.dispatch = expert_dispatch_of(s);
  eo.framework = s.run.framework;
  eo.hardware_queues = s.run.cuda_device_max_connections;
  return eo;
}

namespace {

using scenarios::Collective;
using scenarios::CopyKind;
using scenarios::Group;
using scenarios::HostKind;
using scenarios::Op;
using scenarios::OpKind;
using scenarios::RankClass;
using scenarios::StepGraph;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

// Mixes 64-bit words into a hash (boost::hash_combine's scheme on 64 bits).
constexpr std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 12) + (h >> 4));
}

// What identifies a collective op among its class's ops (base_key): equal keys are repeats, told
// apart by their occurrence number; with the occurrence and the member set it identifies one
// collective instance.
struct CollKey {
  std::int32_t layer = 0;
  std::int32_t microbatch = 0;
  std::int32_t chunk = 0;
  std::int32_t expert = 0;
  std::uint32_t occurrence = 0;
  std::uint32_t set = 0;
  std::uint16_t phase = 0;
  std::uint8_t group = 0;
  std::uint8_t sub = 0;
  bool operator==(const CollKey&) const = default;
};

struct CollKeyHash {
  std::size_t operator()(const CollKey& k) const {
    std::uint64_t h = mix(0, (static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.layer)) << 32) |
                                 static_cast<std::uint32_t>(k.microbatch));
    h = mix(h, (static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.chunk)) << 32) |
                   static_cast<std::uint32_t>(k.expert));
    h = mix(h, (static_cast<std::uint64_t>(k.occurrence) << 32) | k.set);
    h = mix(h, (static_cast<std::uint64_t>(k.phase) << 16) | (static_cast<std::uint64_t>(k.group) << 8) | k.sub);
    return static_cast<std::size_t>(h);
  }
};

// What pairs a send with its recv: the sending and receiving classes, the tag, the direction the
// data flows and the group.
struct P2pKey {
  std::uint32_t sender = 0;
  std::uint32_t receiver = 0;
  std::int32_t tag = 0;
  std::int8_t direction = 0;
  std::uint8_t group = 0;
  bool operator==(const P2pKey&) const = default;
};

struct P2pKeyHash {
  std::size_t operator()(const P2pKey& k) const {
    std::uint64_t h = mix(0, (static_cast<std::uint64_t>(k.sender) << 32) | k.receiver);
    h = mix(h, (static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.tag)) << 16) |
                   (static_cast<std::uint64_t>(static_cast<std::uint8_t>(k.direction)) << 8) | k.group);
    return static_cast<std::size_t>(h);
  }
};

bool is_kernel(const Op& op) {
  switch (op.kind) {
    case OpKind::collective:
    case OpKind::send:
    case OpKind::recv:
    case OpKind::host: return false;
    case OpKind::copy: return op.copy_kind() == CopyKind::d2d;
    default: return true;
  }
}

bool is_pcie_copy(const Op& op) {
  if (op.kind != OpKind::copy) return false;
  const CopyKind k = op.copy_kind();
  return k != CopyKind::d2d && k != CopyKind::disk_read;
}

bool blocks_host(const Op& op) {
  if (op.kind != OpKind::host) return false;
  const HostKind k = op.host_kind();
  return k == HostKind::stream_sync || k == HostKind::gpu_read || k == HostKind::barrier;
}

// Disk reads run on the host thread, as threewalls run does them (a read into a pinned buffer that
// blocks the rank's thread): they occupy the host lane, not a stream.
bool is_disk_read(const Op& op) { return op.kind == OpKind::copy && op.copy_kind() == CopyKind::disk_read; }
// Ops the host lane executes itself (host ops and disk reads).
bool on_host_lane(const Op& op) { return op.kind == OpKind::host || is_disk_read(op); }

profiler::CoarseView coarse_of(const Op& op) {
  if (op.flags & scenarios::kDataLoad) return profiler::CoarseView::host_to_device;
  if (op.flags & scenarios::kMetrics) return profiler::CoarseView::training_metrics;
  return profiler::CoarseView::none;
}

std::string describe_op(const StepGraph& g, const RankClass& rc, std::uint32_t i) {
  const Op& op = rc.ops[i];
  std::ostringstream os;
  os << "rank class " << rc.id << " (" << rc.label << ", representative rank " << rc.representative() << ") op "
     << i << " '" << g.phase_name(op) << "' (" << scenarios::to_string(op.kind);
  if (op.layer >= 0) os << ", layer " << op.layer;
  if (op.microbatch >= 0) os << ", micro-batch " << op.microbatch;
  if (op.kind == OpKind::collective) os << ", group " << scenarios::to_string(op.group);
  if (op.kind == OpKind::send || op.kind == OpKind::recv) os << ", tag " << op.tag;
  os << ")";
  return os.str();
}

// A duration or rate the coster gives for op i, checked: a NaN or infinity (from a calibration
// profile value or a scenario rate past what the checks allow) would otherwise reach every output.
double checked_cost(double v, const StepGraph& g, const RankClass& rc, std::uint32_t i, const char* what) {
  if (std::isfinite(v) && v >= 0.0) return v;
  const Op& op = rc.ops[i];
  std::ostringstream os;
  os << describe_op(g, rc, i) << ": the cost model gives a " << what << " of " << v << " (bytes " << op.bytes
     << ", FLOPs " << op.flops << ", shape [";
  for (std::size_t k = 0; k < op.shape.size(); ++k) os << (k ? ", " : "") << op.shape[k];
  os << "]); a calibration profile value or a cluster rate or latency is out of range";
  throw InputError(os.str());
}

enum class EventType : std::uint8_t { host_resume, op_ready, op_done, gpu_done, instance_post, instance_done };

struct Event {
  double t;
  std::uint64_t seq;
  EventType type;
  std::uint32_t cls;
  std::uint64_t a;  // op index, GPU version or instance id
};
bool earlier(const Event& x, const Event& y) { return x.t < y.t || (x.t == y.t && x.seq < y.seq); }

// The pending events, earliest (time, then sequence number) first: a 4-ary min-heap, shallower than a
// binary one (fewer levels for pop to sift through), beside a FIFO of the events pushed for the
// current time (push_current: about half of a step's events, which then cost no sifting). The FIFO
// holds events in (time, sequence number) order as long as push_current's times do not decrease;
// the earlier of the two fronts comes out first. Sequence numbers are unique, so the order in which
// events come out depends neither on the heap's shape nor on which of the two holds an event.
class EventQueue {
 public:
  [[nodiscard]] bool empty() const { return heap_.empty() && head_ == fifo_.size(); }
  [[nodiscard]] const Event& top() const { return from_fifo() ? fifo_[head_] : heap_.front(); }
  void push(const Event& ev) {
    std::size_t i = heap_.size();
    heap_.push_back(ev);
    while (i > 0) {
      const std::size_t parent = (i - 1) / 4;
      if (!earlier(ev, heap_[parent])) break;
      heap_[i] = heap_[parent];
      i = parent;
    }
    heap_[i] = ev;
  }
  // push() for an event of the current time: appended to the FIFO when no earlier than its last.
  void push_current(const Event& ev) {
    if (head_ < fifo_.size() && ev.t < fifo_.back().t) {
      push(ev);
      return;
    }
    fifo_.push_back(ev);
  }
  // Takes the earliest event into `ev` when its time is at most `t`.
  bool pop_until(double t, Event& ev) {
    if (from_fifo()) {
      if (fifo_[head_].t > t) return false;
      ev = fifo_[head_];
      pop_fifo();
      return true;
    }
    if (heap_.empty() || heap_.front().t > t) return false;
    ev = heap_.front();
    pop_heap();
    return true;
  }

 private:
  [[nodiscard]] bool from_fifo() const {
    return head_ < fifo_.size() && (heap_.empty() || earlier(fifo_[head_], heap_.front()));
  }
  void pop_fifo() {
    if (++head_ == fifo_.size()) {
      fifo_.clear();
      head_ = 0;
    }
  }
  void pop_heap() {
    const Event last = heap_.back();
    heap_.pop_back();
    const std::size_t n = heap_.size();
    if (n == 0) return;
    std::size_t i = 0;
    while (true) {
      const std::size_t first = 4 * i + 1;
      if (first >= n) break;
      std::size_t best = first;
      const std::size_t end = std::min(first + 4, n);
      for (std::size_t k = first + 1; k < end; ++k) {
        if (earlier(heap_[k], heap_[best])) best = k;
      }
      if (!earlier(heap_[best], last)) break;
      heap_[i] = heap_[best];
      i = best;
    }
    heap_[i] = last;
  }

  std::vector<Event> heap_;
  std::vector<Event> fifo_;  // fifo_[head_..] pending
  std::size_t head_ = 0;
};

// A kernel running on a GPU under processor sharing.
struct Active {
  std::uint32_t op;
  double remaining;  // seconds of solo work left
  double sm_fraction;
  double slow = 1.0;  // time with / time alone beside the class's resident NCCL kernels (1: none)
};

// The fields of an op that its kernel's costs are a function of (OpCoster::kernel_time, library_launch,
// nccl_resident_slowdown; sm_fraction), compared bit for bit (a -0.0 is another kernel than a 0.0).
struct KernelKey {
  scenarios::OpShape shape{};
  double flops = 0.0;
  double bytes = 0.0;
  std::int32_t tokens = 0;
  OpKind kind = OpKind::gemm;
  std::uint8_t sub = 0;
  scenarios::DType dtype = scenarios::DType::bf16;
  std::uint8_t flags = 0;

  explicit KernelKey(const Op& op)
      : shape(op.shape), flops(op.flops), bytes(op.bytes), tokens(op.tokens), kind(op.kind), sub(op.sub),
        dtype(op.dtype), flags(op.flags) {}
  [[nodiscard]] bool same(const KernelKey& o) const { return std::memcmp(this, &o, sizeof(KernelKey)) == 0; }
  [[nodiscard]] std::uint64_t hash() const {
    std::uint64_t w[sizeof(KernelKey) / 8];
    std::memcpy(w, this, sizeof w);
    std::uint64_t h = 0;
    for (const std::uint64_t v : w) h = (h + v) * 0x9e3779b97f4a7c15ULL;
    return h ^ (h >> 32);
  }
};
static_assert(sizeof(KernelKey) == sizeof(scenarios::OpShape) + 2 * sizeof(double) + sizeof(std::int32_t) + 4 &&
                  sizeof(KernelKey) % 8 == 0,
              "KernelKey: compared and hashed as bytes, without padding");

// What the executor asks about one distinct kernel of a step (KernelKey), each asked once, when first
// needed.
struct KernelCosts {
  explicit KernelCosts(const Op& op) : key(op) {}
  KernelKey key;
  std::uint64_t hash = 0;  // key.hash()
  double time = 0.0;       // OpCoster::kernel_time
  double sm_fraction = 0.0;
  double launch = 0.0;                             // StepRun::launch_cost
  double slow_pending = 0.0, slow_transfer = 0.0;  // OpCoster::nccl_resident_slowdown, cases 0 and 1
  bool timed = false, launch_known = false, resident_known = false;
};

// Compute class of a kernel for the NCCL-residency slowdown (OpCoster::nccl_resident_slowdown):
// 0 GEMM (with its 128 x 128 output tiles), 1 attention, 2 memory-bound (everything else), 3 grouped
// GEMM.
int compute_class(const Op& op) {
  switch (op.kind) {
    case OpKind::gemm: return 0;
    case OpKind::grouped_gemm: return 3;
    case OpKind::attention: return 1;
    default: return 2;
  }
}

// 128 x 128 output tiles of a GEMM (times its batch) or of a grouped GEMM's every group: forward
// and dgrad write rows x width (rows = every group's, taken as one block), wgrad one n x k weight
// gradient per group.
double gemm_tiles(const Op& op) {
  if (op.kind != OpKind::gemm && op.kind != OpKind::grouped_gemm) return 0.0;
  const auto& s = op.shape;
  auto tiles = [](std::int64_t a, std::int64_t b) {
    return std::ceil(static_cast<double>(std::max<std::int64_t>(a, 1)) / 128.0) *
           std::ceil(static_cast<double>(std::max<std::int64_t>(b, 1)) / 128.0);
  };
  if (op.kind == OpKind::gemm) return tiles(s[0], s[1]) * static_cast<double>(std::max<std::int64_t>(s[3], 1));
  if ((op.flags & scenarios::kWgrad) != 0)
    return tiles(s[1], s[2]) * static_cast<double>(std::max<std::int64_t>(s[3], 1));
  return tiles(s[0], s[1]);
}

}  // namespace

namespace {

// nccl_resident_factor from the coster's slowdowns of the op with a pending (`slow_pending`) and a
// transferring (`slow_transfer`) NCCL kernel resident.
double resident_factor(double slow_pending, double slow_transfer, bool pending, bool transferring) {
  double f = 0.0;
  if (pending) f = std::max(f, slow_pending);
  if (transferring) f = std::max(f, slow_transfer);
  return f > 0.0 ? f : 1.0;
}

}  // namespace

double nccl_resident_factor(const OpCoster& coster, const Op& op, bool pending, bool transferring) {
  if ((!pending && !transferring) || !coster.models_nccl_residency()) return 1.0;
  const int k = compute_class(op);
  const double tiles = gemm_tiles(op);
  return resident_factor(pending ? coster.nccl_resident_slowdown(0, k, tiles) : 0.0,
                         transferring ? coster.nccl_resident_slowdown(1, k, tiles) : 0.0, pending, transferring);
}

namespace {

// What the executor does with an op when the device reaches it, by its kind: the host lane runs it
// (host ops, disk reads), the GPU runs it as a kernel (d2d copies too), it is a PCIe copy, or a
// collective, send or recv.
enum class Role : std::uint8_t { host_lane, kernel, pcie_copy, comm };

Role role_of(const Op& op) {
  if (on_host_lane(op)) return Role::host_lane;
  if (is_kernel(op)) return Role::kernel;
  return is_pcie_copy(op) ? Role::pcie_copy : Role::comm;
}

// The per-op state that starting an op reads (StepRun::try_start, start_op), in one cache line per op:
// with its role, starting and completing an op of the device do not read the op itself.
struct alignas(64) OpState {
  double start = -1.0;
  double launch = -1.0;
  double ready = -1.0;
  double mark_host = -1.0;
  double mark_device = 0.0;
  std::uint32_t pending = 0;
  std::uint32_t stream_pos = kNone;
  std::uint32_t hw_queue = kNone;
  std::uint32_t hw_pos = kNone;
  std::uint32_t share_from = kNone;
  std::uint16_t queue = 0;
  std::uint8_t ready_scheduled = 0;
  std::uint8_t shared : 1 = 0;
  Role role : 2 = Role::kernel;
};
static_assert(sizeof(OpState) == 64, "OpState: one cache line per op");

struct ClassState {
  const RankClass* rc = nullptr;
  int rep = -1;
  double compute_factor = 1.0;
  Timing timing = Timing::none;
  // host_cost: host time before op i is launched (or, host-lane ops, its duration); host_post: host
  // time after the launch (event records behind it); host_arrive: host-lane ops, paid when the host
  // reaches the op, before it waits for its dependencies (timing markers behind them).
  // start, launch, ready, mark_host, mark_device, pending, stream_pos, hw_queue, hw_pos, share_from,
  // queue, ready_scheduled and shared of op i are op[i]'s (OpState).
  std::vector<OpState> op;
  std::vector<double> end, host_cost, host_post, host_arrive, device_extra;
  // Timed eager ops (a real run's two timing events around the launch, docs/simulator.md "Phase
  // records"): mark_before = host cost from the op's turn to its start marker's record (the waits and
  // the record itself), mark_host / mark_end_host = host times the start / end markers were recorded,
  // ready = when the op's stream and dependencies let it (and hence its start marker) run on the device.
  std::vector<double> mark_before, mark_end_host;
  // mark_device: device time of one timing marker of a timed eager op (0 when untimed): the op holds
  // its stream for its two markers (device_extra); its record starts after the start marker.
  // Shared boundary markers (docs/profiler.md): share_from[i] = the timed op right before i on its
  // stream whose end marker i may start at (nothing enqueued between them; kNone otherwise);
  // shared[i]: i did (the stream had not reached that marker when the host came to i), so i holds
  // its stream for one marker, not two, and its record starts at that op's end marker.
  std::uint32_t arrived = kNone;  // the host-lane op whose host_arrive has been paid
  double host_tail = 0.0;         // the step-end join, paid once every op is issued
  double host_end = -1.0;         // when the host finished the join
  std::vector<std::uint32_t> rdep_off, rdeps;
  std::vector<std::vector<std::uint32_t>> stream_ops;
  std::vector<std::uint32_t> stream_head;
  // stream_pos: op -> position in its queue
  // Ops queue in FIFO order per stream, except point-to-point ops: those queue per stream and peer
  // direction, as PyTorch gives each pair of ranks its own NCCL communicator and stream (a pending
  // send to the previous stage does not hold back a receive from the next one).
  // queue: op -> queue index
  // Hardware work queues (ExecutorOptions::hardware_queues): op -> its queue (kNone: not in one, i.e.
  // host-lane ops and ops replayed in a CUDA graph), each queue's eager device ops in issue order, and
  // per queue the first op that has not started (an op starts only once every op ahead of it has).
  std::vector<std::vector<std::uint32_t>> hw_ops;
  std::vector<std::uint32_t> hw_head;
  std::vector<std::uint32_t> occurrence;  // collective ops: how many identical keys came before
  std::uint32_t host_next = 0;
  double host_time = 0.0;
  std::uint32_t host_blocked = kNone;
  std::size_t done = 0;
  // GPU
  std::vector<Active> active;
  double gpu_last = 0.0;
  std::uint64_t gpu_version = 0;
  // NCCL kernels resident on the GPU (docs/simulator.md, "Compute beside resident NCCL kernels"): a
  // communication op is resident from its start on its stream until it completes; "pending" until
  // every member has arrived (it spins, waiting for its peers), then "transferring". nccl_phase: op ->
  // 0 not resident, 1 pending, 2 transferring.
  int nccl_pending = 0;
  int nccl_transfer = 0;
  std::vector<std::uint8_t> nccl_phase;
  std::vector<std::uint32_t> kernel;  // op -> its entry of StepRun::kernels_ (kNone: not a kernel op)
};

struct Member {
  std::uint32_t cls;
  std::uint32_t op;
};

// One run of a collective, a send/recv pair or a PCIe copy: its members (class, op), and the flows
// waiting for their latency term to elapse.
struct Instance {
  std::vector<Member> members;
  std::size_t expected = 0;
  bool p2p = false;
  // The flows of its plan (StepRun::plans_, whose entries live as long as the step run) once
  // started, until they are handed to the flow engine.
  const std::vector<PlacedFlow>* flows = nullptr;
};

// A transfer this short alone (seconds) is below what the network model resolves: an instance whose
// flows move their bytes within it (a tensor-parallel FP8 amax all-reduce: 4 bytes) takes its lone
// time in flow fidelity too, without entering the network model, where it would take from or give
// to the other flows less than this (docs/simulator.md, "Collectives as flows").
inline constexpr double kNegligibleTransferS = 1e-9;

struct Plan {
  double latency = 0.0;
  double lone = 0.0;
  std::vector<PlacedFlow> flows;
  bool negligible = false;  // the flows' transfer alone is shorter than kNegligibleTransferS
};

class StepRun {
 public:
  StepRun(const OpCoster& coster, const ExecutorOptions& opt, const StepGraph& g, const Platform& p,
          std::span<const double> factor, std::span<const Timing> timing, double epoch, FlowEngine* engine)
      : coster_(coster), opt_(opt), g_(g), platform_(p), epoch_(epoch), engine_(engine), host_(coster.host_costs()),
        now_(epoch) {
    if (opt_.fidelity == Fidelity::flow && engine_ == nullptr) {
      throw std::logic_error("flow fidelity needs a flow engine");
    }
    if (g_.layout.world() != platform_.world()) {
      throw InputError("the StepGraph's layout has " + std::to_string(g_.layout.world()) +
                       " ranks but the cluster has " + std::to_string(platform_.world()) + " GPUs");
    }
    capacity_.reserve(platform_.links().size());
    for (const Link& l : platform_.links()) capacity_.push_back(l.bandwidth.value);
    sm_count_ = coster_.sm_count();
    nccl_residency_ = coster_.models_nccl_residency();
    classes_.resize(g_.classes.size());
    for (std::size_t c = 0; c < g_.classes.size(); ++c) {
      init_class(static_cast<std::uint32_t>(c), factor.empty() ? 1.0 : factor[c],
                 timing.empty() ? Timing::none : timing[c]);
    }
  }

  StepResult run() {
    for (std::uint32_t c = 0; c < classes_.size(); ++c) run_host(c);
    std::vector<std::uint64_t> completed;
    while (true) {
      const double t_ev = queue_.empty() ? kInf : queue_.top().t;
      if (engine_ != nullptr && engine_->busy()) {
        // The engine's next completion may come before our next event.
        completed.clear();
        const double t = engine_->advance(t_ev, completed);
        now_ = std::max(now_, t);
        for (std::uint64_t id : completed) finish_instance(static_cast<std::uint32_t>(id));
        // A flow may have finished without completing its group: go on until our next event.
        if (!completed.empty() || t < t_ev) continue;
      } else {
        if (queue_.empty()) break;
        now_ = std::max(now_, t_ev);
      }
      Event ev{};
      while (queue_.pop_until(now_, ev)) handle(ev);
    }
    check_finished();
    return collect();
  }

 private:
  // ---------------------------------------------------------------- setup
  void init_class(std::uint32_t c, double factor, Timing timing) {
    ClassState& s = classes_[c];
    const RankClass& rc = g_.classes[c];
    s.rc = &rc;
    s.rep = rc.representative();
    if (s.rep < 0) throw InputError("rank class " + std::to_string(rc.id) + " (" + rc.label + ") has no ranks");
    s.compute_factor = factor;
    s.timing = timing;
    const std::size_t n = rc.ops.size();
    s.op.assign(n, OpState{});
    s.end.assign(n, -1.0);
    s.host_cost.assign(n, 0.0);
    s.host_post.assign(n, 0.0);
    s.host_arrive.assign(n, 0.0);
    s.device_extra.assign(n, 0.0);
    s.mark_before.assign(n, -1.0);
    s.mark_end_host.assign(n, -1.0);
    s.occurrence.assign(n, 0);
    s.nccl_phase.assign(n, 0);
    s.kernel.assign(n, kNone);
    s.host_time = epoch_;
    s.gpu_last = epoch_;
    // Dependencies and their reverse.
    std::vector<std::uint32_t> count(n + 1, 0);
    for (std::uint32_t i = 0; i < n; ++i) {
      const Op& op = rc.ops[i];
      if (op.deps_end < op.deps_begin || op.deps_end > rc.deps.size()) {
        throw InputError(describe_op(g_, rc, i) + ": dependency range outside the class's dependency list");
      }
      for (std::uint32_t d = op.deps_begin; d < op.deps_end; ++d) {
        const std::uint32_t dep = rc.deps[d];
        if (dep >= i) {
          throw InputError(describe_op(g_, rc, i) + ": depends on op " + std::to_string(dep) +
                           ", which is not an earlier op of the class");
        }
        ++count[dep + 1];
        ++s.op[i].pending;
      }
      if (op.stream >= g_.streams.size()) {
        throw InputError(describe_op(g_, rc, i) + ": stream index " + std::to_string(op.stream) + " is not declared");
      }
    }
    for (std::size_t i = 1; i <= n; ++i) count[i] += count[i - 1];
    s.rdep_off = count;
    s.rdeps.assign(count[n], 0);
    std::vector<std::uint32_t> fill(count.begin(), count.end() - 1);
    for (std::uint32_t i = 0; i < n; ++i) {
      const Op& op = rc.ops[i];
      for (std::uint32_t d = op.deps_begin; d < op.deps_end; ++d) s.rdeps[fill[rc.deps[d]]++] = i;
    }
    // Streams (host ops live on the host lane only), the streams the device ops use, and the
    // occurrence numbers of collectives with identical keys (collectives are device ops).
    const std::size_t streams = g_.streams.size();
    s.stream_ops.assign(3 * streams, {});
    s.stream_head.assign(3 * streams, 0);
    std::vector<std::uint8_t> used(streams, 0);
    // Collectives seen so far by key (base_key) and how many: open addressing over a power of two
    // slots at most half full.
    std::size_t collectives = 0;
    for (const Op& op : rc.ops) collectives += op.kind == OpKind::collective ? 1 : 0;
    int bits = 4;
    while ((std::size_t{1} << bits) < 2 * collectives) ++bits;
    const std::size_t slots = std::size_t{1} << bits;
    struct Seen {
      CollKey key;
      std::uint32_t count = 0;  // 0: an empty slot
    };
    std::vector<Seen> seen(slots);
    for (std::uint32_t i = 0; i < n; ++i) {
      const Op& op = rc.ops[i];
      s.op[i].role = role_of(op);
      if (s.op[i].role == Role::host_lane) continue;
      used[op.stream] = 1;
      if (s.op[i].role == Role::kernel) s.kernel[i] = kernel_of(op);
      std::size_t q = op.stream;
      if (op.kind == OpKind::send || op.kind == OpKind::recv) q = streams + 2 * op.stream + (op.peer > 0 ? 1 : 0);
      s.op[i].queue = static_cast<std::uint16_t>(q);
      s.op[i].stream_pos = static_cast<std::uint32_t>(s.stream_ops[q].size());
      s.stream_ops[q].push_back(i);
      if (op.kind == OpKind::collective) {
        const CollKey key = base_key(op);
        // The hash's high bits after a multiplication (its low bits alone cluster).
        std::size_t at = (CollKeyHash{}(key)*0x9e3779b97f4a7c15ULL) >> (64 - bits);
        while (seen[at].count != 0 && !(seen[at].key == key)) at = (at + 1) & (slots - 1);
        if (seen[at].count == 0) seen[at].key = key;
        s.occurrence[i] = seen[at].count++;
      }
    }
    const std::vector<int> in_run = graph_run_of(rc);
    assign_hardware_queues(s, used, in_run);
    host_lane_costs(s, used, in_run);
  }

  // The CUDA-graph run of each op of a class (its index in rc.graph_runs; -1: none, and for host-lane
  // ops, which are never captured).
  static std::vector<int> graph_run_of(const RankClass& rc) {
    const std::size_t n = rc.ops.size();
    std::vector<int> in_run(n, -1);
    for (std::size_t r = 0; r < rc.graph_runs.size(); ++r) {
      const scenarios::GraphRun& run = rc.graph_runs[r];
      if (run.first_op >= run.end_op || run.end_op > n) {
        throw InputError("rank class " + std::to_string(rc.id) + ": CUDA-graph run [" + std::to_string(run.first_op) +
                         ", " + std::to_string(run.end_op) + ") is outside its ops");
      }
      for (std::uint32_t i = run.first_op; i < run.end_op; ++i) {
        if (!on_host_lane(rc.ops[i])) in_run[i] = static_cast<int>(r);  // host work is never captured
      }
    }
    return in_run;
  }

  // Hardware work queues (docs/simulator.md, "Hardware work queues"). A GPU has Q hardware queues
  // (CUDA_DEVICE_MAX_CONNECTIONS, default 8); CUDA maps each stream onto one round-robin in stream
  // creation order (threewalls run creates a class's streams in increasing stream index:
  // backend CudaDevice::open), so the k-th stream the class uses (k = 0, 1, ...) is on queue k mod Q.
  // A queue dispatches in issue order: an eager device op starts only once every op issued before it
  // to its queue has started (head-of-line blocking: an op waiting for its stream or an event holds
  // back the ops of other streams behind it). The host issues eager ops in op order. Ops replayed in
  // a CUDA graph are not in a queue (the graph's own launch dispatches them); nor are host-lane ops.
  // Fills hw_queue and hw_pos of s.op, which are kNone on entry. used: by stream, whether a device op
  // of the class is on it; in_run: graph_run_of.
  void assign_hardware_queues(ClassState& s, const std::vector<std::uint8_t>& used,
                              const std::vector<int>& in_run) const {
    const RankClass& rc = *s.rc;
    const std::size_t n = rc.ops.size();
    s.hw_ops.clear();
    s.hw_head.clear();
    if (opt_.hardware_queues <= 0) return;
    std::vector<std::uint32_t> queue_of(g_.streams.size(), kNone);
    std::uint32_t k = 0;
    for (std::size_t st = 0; st < used.size(); ++st) {
      // Copy streams' host-device copies go through the copy engines' own connections.
      if (used[st] && g_.streams[st].kind != scenarios::StreamKind::copy) {
        queue_of[st] = k++ % static_cast<std::uint32_t>(opt_.hardware_queues);
      }
    }
    s.hw_ops.assign(std::min<std::size_t>(k, static_cast<std::size_t>(opt_.hardware_queues)), {});
    s.hw_head.assign(s.hw_ops.size(), 0);
    for (std::uint32_t i = 0; i < n; ++i) {
      if (on_host_lane(rc.ops[i]) || in_run[i] >= 0) continue;
      const std::uint32_t q = queue_of[rc.ops[i].stream];
      if (q == kNone) continue;
      s.op[i].hw_queue = q;
      s.op[i].hw_pos = static_cast<std::uint32_t>(s.hw_ops[q].size());
      s.hw_ops[q].push_back(i);
    }
  }

  // Host-lane costs, mirroring what threewalls run issues for each op (docs/simulator.md, "Host lane";
  // docs/backend.md, "Threads, streams, events"); e = event_record, w = stream_wait (a
  // cudaStreamWaitEvent across streams; e when the profile lacks host.stream_wait):
  //   eager op      before the launch: w per dependency it must wait for on its stream (one on
  //                 another stream, or in a CUDA-graph run), e for the timing marker (timed steps),
  //                 then the launch: collective_launch for NCCL calls, gemm_launch / grouped_gemm_launch /
  //                 attention_launch / attention_bwd_launch for GEMM / grouped-GEMM / attention ops (host
  //                 time of the library call, by shape when the profile has host.gemm_call /
  //                 host.grouped_gemm_call; kernel_launch when it lacks them), else
  //                 kernel_launch; plus stream_cycle_extra(N) on kernel and library launches when the
  //                 class's eager launches use N > 1 streams; after it: e for the
  //                 timing marker (timed steps), e when a later op waits for it across streams, a run
  //                 boundary or on the host
  //   graph run     on its first op: w per dependency from before the run it must wait for, e + w per
  //                 other stream of the run (joined before), graph_launch (none after an explicit
  //                 graph_launch host op); after its last op: e (end event) + w per other stream;
  //                 graph_node of device time per op, + 2 timing_marker when timed (marker nodes)
  //   host op       on arrival (timed steps): e per device stream its dependencies are on (gpu_read:
  //                 its data's stream), then the wait, then stream_sync / gpu_read (+ e: the event
  //                 the read waits on) / the hint
  //                 timed eager kernels and copies: 2 timing_marker of device time (the markers)
  //   pytorch_eager an op whose body has a pytorch_host.* family: that host time in place of its launch
  //                 and framework costs (CostModelCoster::framework_body_host); every other eager
  //                 forward launch + framework_op, every backward one + framework_backward_op
  //                 (framework_op without it); a gpu_read costs framework_sync (no event) when the
  //                 profile has it; with host.framework_stream_op, a per-expert launch (op.expert >= 0)
  //                 of a class whose eager launches use N > 1 streams pays framework_stream_extra(N)
  //                 in place of stream_cycle_extra(N), and other launches pay neither; a timed op
  //                 pays framework_record_op in place of record_op when the profile has it
  //   disk read     on the host lane: copy(disk_read, bytes) once its dependencies are done
  //   step          at the start, e + w per device stream but the anchor (the fence behind the epoch: an
  //                 event on the anchor, a wait on each other used stream); at the end,
  //                 e + w per device stream but the anchor (joined into it): the step ends no earlier
  // used: by stream, whether a device op of the class is on it; in_run: graph_run_of.
  void host_lane_costs(ClassState& s, const std::vector<std::uint8_t>& used, const std::vector<int>& in_run) {
    const RankClass& rc = *s.rc;
    const std::size_t n = rc.ops.size();
    const double e = host_.event_record.value;
    const double w = host_.stream_wait ? host_.stream_wait->value : e;
    auto timed = [&](const Op& op) {
      return s.timing == Timing::every_op || (s.timing == Timing::coarse_ops && coarse_of(op) != profiler::CoarseView::none);
    };
    // Which ops something waits for across streams, runs or on the host (an event is recorded).
    // Launches that rotate over several streams cost more each (host.stream_cycle): the streams of
    // the eager kernel and library launches (not NCCL calls, copies or graph replays), each with its
    // own OpRunner in threewalls run.
    std::vector<std::uint8_t> needs_event(n, 0);
    std::vector<std::uint32_t> waits(n, 0);
    std::vector<std::uint8_t> launch_streams(g_.streams.size(), 0);
    for (std::uint32_t j = 0; j < n; ++j) {
      const Op& op = rc.ops[j];
      if (rotates(op) && in_run[j] < 0) launch_streams[op.stream] = 1;
      for (std::uint32_t d = op.deps_begin; d < op.deps_end; ++d) {
        const std::uint32_t dep = rc.deps[d];
        if (on_host_lane(rc.ops[dep])) continue;  // done before the host moved on
        if (in_run[j] >= 0 && in_run[j] == in_run[dep]) continue;  // inside one capture
        const bool other_stream = rc.ops[dep].stream != op.stream;
        if (on_host_lane(op) || other_stream || in_run[j] >= 0 || in_run[dep] >= 0) needs_event[dep] = 1;
        if (!on_host_lane(op) && in_run[j] < 0 && (other_stream || in_run[dep] >= 0)) ++waits[j];
      }
    }
    int rotating = 0;
    for (const std::uint8_t u : launch_streams) rotating += u;
    const double cycle_extra = rotating > 1 ? coster_.stream_cycle_extra(rotating).value : 0.0;
    // A framework's dispatch per eager launch (PyTorch: Python, the dispatcher, autograd recording).
    // A backward launch pays the autograd engine's node and the C++ dispatch instead
    // (host.framework_backward_op; framework_op without the family), and a device-to-host read is the
    // framework's own, in place of gpu_read and the event it waits on (host.framework_sync; gpu_read
    // without it).
    const bool eager_fw = opt_.framework == scenarios::Framework::pytorch_eager;
    // A training step's forward ops record their autograd nodes (host.framework_autograd_op).
    const bool records_autograd = g_.step_kind == "train" && host_.framework_autograd_op.has_value();
    const double framework_op =
        eager_fw ? (records_autograd ? host_.framework_autograd_op->value : host_.framework_op.value) : 0.0;
    const double framework_bwd =
        eager_fw ? (host_.framework_backward_op ? host_.framework_backward_op->value : framework_op) : 0.0;
    const bool framework_read = eager_fw && host_.framework_sync.has_value();
    // An eager framework's expert loop over several streams (host.framework_stream_op): PyTorch's
    // side-stream dispatch, allocator stream events and the autograd engine's cross-stream syncs,
    // charged to the loop's launches in place of the OpRunner figure.
    const std::optional<Seconds> fw_stream =
        eager_fw && rotating > 1 ? coster_.framework_stream_extra(rotating) : std::nullopt;
    // A timed op's whole recording path (start marker included): the framework's where it records
    // (host.framework_record_op), else threewalls run's (host.record_op); empty: two markers.
    const std::optional<Seconds>& recording =
        eager_fw && host_.framework_record_op ? host_.framework_record_op : host_.record_op;
    const bool training = g_.step_kind == "train";
    for (std::uint32_t i = 0; i < n; ++i) {
      const Op& op = rc.ops[i];
      if (op.kind == OpKind::host) {
        if (framework_read && op.host_kind() == HostKind::gpu_read) {
          s.host_cost[i] = host_.framework_sync->value;
        } else {
          s.host_cost[i] = host_op_cost(op).value + (op.host_kind() == HostKind::gpu_read ? e : 0.0);
        }
        if (timed(op) && blocks_host(op)) {
          std::vector<std::uint8_t> streams(g_.streams.size(), 0);
          std::size_t k = 0;
          for (std::uint32_t d = op.deps_begin; d < op.deps_end; ++d) {
            const Op& dep = rc.ops[rc.deps[d]];
            if (on_host_lane(dep) || streams[dep.stream]) continue;
            streams[dep.stream] = 1;
            ++k;
          }
          if (k == 0 && op.host_kind() == HostKind::gpu_read) k = 1;
          s.host_arrive[i] = static_cast<double>(k) * e;
        }
      } else if (is_disk_read(op)) {
        s.host_cost[i] = checked_cost(coster_.copy_time(op.copy_kind(), Bytes(op.bytes)).value, g_, rc, i, "copy time");
      } else if (in_run[i] < 0) {
        // PyTorch eager's measured host time of the op's whole body where the profile has it, in
        // place of the launch and the framework's per-launch dispatch.
        const std::optional<Seconds> body = eager_fw ? coster_.framework_body_host(op, training) : std::nullopt;
        const double issue =
            body ? body->value
                 : launch_of(s, i) + ((op.flags & scenarios::kBackward) != 0 ? framework_bwd : framework_op);
        const double rotating_extra = !rotates(op) ? 0.0
                                      : fw_stream  ? (op.expert >= 0 ? fw_stream->value : 0.0)
                                                   : cycle_extra;
        const double launch = issue + rotating_extra + host_.op_dispatch.value +
                              (eager_fw && (op.flags & scenarios::kNewShape) != 0 && host_.framework_attention_plan
                                   ? host_.framework_attention_plan->value
                                   : 0.0);
        // A recorded op: the start marker before the launch (e), the rest of the recording path after
        // it (host.record_op less that marker; e for the end marker without the family).
        const double record_after = recording ? std::max(0.0, recording->value - e) : e;
        s.host_cost[i] = static_cast<double>(waits[i]) * w + (timed(op) ? e : 0.0) + launch;
        s.host_post[i] = (timed(op) ? record_after : 0.0) + (needs_event[i] ? e : 0.0);
        if (timed(op)) s.mark_before[i] = static_cast<double>(waits[i]) * w + e;
        // The two timing markers are event records on the op's stream: each holds the stream for
        // timing_marker of device time (calibration/tools/timed_op_gap.cu), so a recorded step of
        // back-to-back kernels runs slower than an unrecorded one, in the real run as here.
        if (timed(op) && !op.is_comm()) {
          s.op[i].mark_device = host_.timing_marker.value;
          s.device_extra[i] = 2.0 * s.op[i].mark_device;
        }
      }
    }
    // Shared boundary markers, as threewalls run issues them (backend/src/executor.cpp, issue_op):
    // an eager op issued right behind a timed eager op on its stream, with no cross-stream wait and
    // no event recorded behind that op, may start at its end marker; host-lane ops and graph runs
    // in between end it on every stream. Whether it does is decided when the op starts (start_op).
    // The host lane still pays the start marker's record (e): when the marker is shared the device
    // is behind the host, so that host time is hidden (the real run pays an event query instead).
    // An untimed class has no marker to share.
    if (s.timing != Timing::none) {
      std::vector<std::uint32_t> open(g_.streams.size(), kNone);
      auto p2p = [](const Op& o) { return o.kind == OpKind::send || o.kind == OpKind::recv; };
      for (std::uint32_t i = 0; i < n; ++i) {
        const Op& op = rc.ops[i];
        if (on_host_lane(op) || in_run[i] >= 0) {
          std::fill(open.begin(), open.end(), kNone);
          continue;
        }
        std::uint32_t& o = open[op.stream];
        const bool grouped = i > 0 && p2p(op) && p2p(rc.ops[i - 1]) && rc.ops[i - 1].stream == op.stream &&
                             in_run[i - 1] < 0;
        if (grouped) {  // one NCCL group: one start and one end marker for all its members
          if (o != kNone && needs_event[i]) o = kNone;
          continue;
        }
        if (waits[i] > 0) o = kNone;
        if (timed(op) && o != kNone) s.op[i].share_from = o;
        o = timed(op) && !needs_event[i] ? i : kNone;
      }
    }
    for (const scenarios::GraphRun& run : rc.graph_runs) {
      const bool explicit_launch = run.first_op > 0 && rc.ops[run.first_op - 1].kind == OpKind::host &&
                                   rc.ops[run.first_op - 1].host_kind() == HostKind::graph_launch;
      std::vector<std::uint8_t> streams(g_.streams.size(), 0);
      std::size_t extra_streams = 0;
      std::size_t external = 0;
      std::uint32_t first = kNone;
      std::uint32_t last = kNone;
      for (std::uint32_t i = run.first_op; i < run.end_op; ++i) {
        const Op& op = rc.ops[i];
        if (in_run[i] < 0) continue;
        if (first == kNone) first = i;
        last = i;
        if (!streams[op.stream]) {
          streams[op.stream] = 1;
          if (i != first) ++extra_streams;
        }
        s.device_extra[i] = host_.graph_node.value;
        // A recorded step replays the run's timed capture: a timing-marker node on the op's stream
        // before and after every recorded op (backend executor.cpp capture_once), each holding the
        // stream like an eager marker (timing_marker); the record runs from the start marker on.
        if (timed(op) && !op.is_comm()) {
          s.op[i].mark_device = host_.timing_marker.value;
          s.device_extra[i] += 2.0 * s.op[i].mark_device;
        }
        for (std::uint32_t d = op.deps_begin; d < op.deps_end; ++d) {
          const std::uint32_t dep = rc.deps[d];
          if (dep >= run.first_op || on_host_lane(rc.ops[dep])) continue;
          if (in_run[dep] < 0 && rc.ops[dep].stream == rc.ops[first].stream) continue;  // FIFO on the launch stream
          ++external;
        }
      }
      if (first == kNone) continue;
      const double ex = static_cast<double>(extra_streams);
      s.host_cost[first] = static_cast<double>(external) * w + ex * (e + w) + (explicit_launch ? 0.0 : host_.graph_launch.value);
      s.host_post[last] = e + ex * w;
    }
    std::size_t streams_used = 0;
    for (std::uint8_t u : used) streams_used += u;
    s.host_time = epoch_ + (streams_used > 0 ? e + static_cast<double>(streams_used - 1) * w : 0.0);
    s.host_tail = streams_used > 1 ? static_cast<double>(streams_used - 1) * (e + w) : 0.0;
  }

  // Host time of one eager launch of `op` (the library call OpRunner makes for its kind).
  double launch_cost(const Op& op) const {
    if (op.is_comm()) return host_.collective_launch.value;
    if (const auto by_shape = coster_.library_launch(op)) return by_shape->value;
    const std::optional<Seconds>* call = nullptr;
    switch (op.kind) {
      case OpKind::gemm: call = &host_.gemm_launch; break;
      case OpKind::grouped_gemm: call = &host_.grouped_gemm_launch; break;
      case OpKind::attention:
        call = (op.flags & scenarios::kBackward) != 0 ? &host_.attention_bwd_launch : &host_.attention_launch;
        break;
      default: break;
    }
    return call != nullptr && call->has_value() ? (*call)->value : host_.kernel_launch.value;
  }

  // launch_cost of op i of a class, asked once per distinct kernel.
  double launch_of(const ClassState& s, std::uint32_t i) {
    if (s.kernel[i] == kNone) return launch_cost(s.rc->ops[i]);
    KernelCosts& k = kernels_[s.kernel[i]];
    if (!k.launch_known) {
      k.launch = launch_cost(s.rc->ops[i]);
      k.launch_known = true;
    }
    return k.launch;
  }

  // The entry of kernels_ of a kernel op (added when its key is new): open addressing over
  // kernel_slots_, a power of two at most half full.
  std::uint32_t kernel_of(const Op& op) {
    const KernelKey key(op);
    const std::uint64_t h = key.hash();
    if (2 * (kernels_.size() + 1) > kernel_slots_.size()) {
      std::vector<std::uint32_t> slots(std::max<std::size_t>(1024, 2 * kernel_slots_.size()), kNone);
      for (std::uint32_t k = 0; k < kernels_.size(); ++k) {
        std::size_t at = kernels_[k].hash & (slots.size() - 1);
        while (slots[at] != kNone) at = (at + 1) & (slots.size() - 1);
        slots[at] = k;
      }
      kernel_slots_.swap(slots);
    }
    const std::size_t mask = kernel_slots_.size() - 1;
    for (std::size_t at = h & mask;; at = (at + 1) & mask) {
      const std::uint32_t k = kernel_slots_[at];
      if (k == kNone) {
        kernel_slots_[at] = static_cast<std::uint32_t>(kernels_.size());
        kernels_.emplace_back(op);
        kernels_.back().hash = h;
        return kernel_slots_[at];
      }
      if (kernels_[k].hash == h && kernels_[k].key.same(key)) return k;
    }
  }

  // A kernel or library launch of OpRunner (what host.stream_cycle measures rotating over streams).
  static bool rotates(const Op& op) {
    return op.kind != OpKind::host && op.kind != OpKind::copy && !op.is_comm();
  }

  Seconds host_op_cost(const Op& op) const {
    switch (op.host_kind()) {
      case HostKind::stream_sync: return host_.stream_sync;
      case HostKind::gpu_read: return host_.gpu_read;
      case HostKind::graph_launch: return host_.graph_launch;
      case HostKind::framework:
      case HostKind::barrier:
        // shape[0]: a duration hint in nanoseconds (0: the profile's framework-op cost).
        if (op.shape[0] > 0) return Seconds(static_cast<double>(op.shape[0]) * 1e-9);
        return op.host_kind() == HostKind::framework ? host_.framework_op : Seconds(0.0);
    }
    return Seconds(0.0);
  }

  // The op's collective key without occurrence and member set.
  static CollKey base_key(const Op& op) {
    CollKey k;
    k.group = static_cast<std::uint8_t>(op.group);
    k.phase = op.phase;
    k.layer = op.layer;
    k.microbatch = op.microbatch;
    k.chunk = op.chunk;
    k.expert = op.expert;
    k.sub = op.sub;
    return k;
  }

  // ---------------------------------------------------------------- events
  void push(double t, EventType type, std::uint32_t cls, std::uint64_t a) {
    const Event ev{t, seq_++, type, cls, a};
    if (t == now_) {
      queue_.push_current(ev);  // now_ never decreases
    } else {
      queue_.push(ev);
    }
  }

  void handle(const Event& ev) {
    switch (ev.type) {
      case EventType::host_resume: run_host(ev.cls); break;
      case EventType::op_ready: {
        ClassState& s = classes_[ev.cls];
        s.op[ev.a].ready_scheduled = 0;
        try_start(ev.cls, static_cast<std::uint32_t>(ev.a));
        break;
      }
      case EventType::op_done: complete(ev.cls, static_cast<std::uint32_t>(ev.a)); break;
      case EventType::gpu_done: gpu_event(ev.cls, ev.a); break;
      case EventType::instance_post: post_instance(static_cast<std::uint32_t>(ev.a)); break;
      case EventType::instance_done: finish_instance(static_cast<std::uint32_t>(ev.a)); break;
    }
  }

  // ---------------------------------------------------------------- host lane
  void run_host(std::uint32_t c) {
    ClassState& s = classes_[c];
    const RankClass& rc = *s.rc;
    s.host_time = std::max(s.host_time, now_);
    s.host_blocked = kNone;
    while (s.host_next < rc.ops.size()) {
      const std::uint32_t i = s.host_next;
      const Op& op = rc.ops[i];
      if (on_host_lane(op)) {
        if (s.arrived != i) {
          s.arrived = i;
          s.host_time += s.host_arrive[i];
        }
        if ((blocks_host(op) || is_disk_read(op)) && s.op[i].pending > 0) {
          s.host_blocked = i;
          return;
        }
        s.op[i].start = s.host_time;
        s.host_time += s.host_cost[i];
        s.op[i].launch = s.host_time;
        push(s.host_time, EventType::op_done, c, i);
      } else {
        if (s.mark_before[i] >= 0.0) {
          s.op[i].mark_host = s.host_time + s.mark_before[i];
          s.mark_end_host[i] = s.host_time + s.host_cost[i] + host_.event_record.value;
        }
        s.host_time += s.host_cost[i];
        s.op[i].launch = s.host_time;
        try_start(c, i);
        s.host_time += s.host_post[i];
      }
      ++s.host_next;
    }
    if (s.host_end < 0.0) {
      s.host_time += s.host_tail;
      s.host_end = s.host_time;
    }
  }

  // ---------------------------------------------------------------- device
  void try_start(std::uint32_t c, std::uint32_t i) {
    ClassState& s = classes_[c];
    if (s.op[i].start >= 0.0 || s.op[i].launch < 0.0 || s.op[i].pending > 0) return;
    if (s.op[i].role == Role::host_lane) return;
    if (s.stream_head[s.op[i].queue] != s.op[i].stream_pos) return;
    // Head-of-line blocking in its hardware queue (its timing marker waits there too).
    if (s.op[i].hw_queue != kNone && s.hw_head[s.op[i].hw_queue] != s.op[i].hw_pos) return;
    if (s.op[i].ready < 0.0) s.op[i].ready = now_;
    if (s.op[i].launch > now_) {
      if (!s.op[i].ready_scheduled) {
        s.op[i].ready_scheduled = 1;
        push(s.op[i].launch, EventType::op_ready, c, i);
      }
      return;
    }
    start_op(c, i);
  }

  // The next op of hardware queue q may be dispatched once every op issued to q before it is released:
  // started, and for an op timed by the profiler on this step, ended. A kernel, an NCCL collective or
  // a receive releases its queue when it starts (measured with one connection: a kernel of another
  // stream issued after a 20 ms kernel, a 3.3 ms all-reduce or a 21 ms receive in PyTorch started
  // within 0.35 ms), and so does one followed by an untimed event; a CUDA event *with timing* recorded
  // behind it, as every timed op's end marker, holds the queue until the op ends (the same kernel:
  // 20.2 ms), which is how threewalls run's recorded steps lose their overlap with one connection
  // (docs/validation/hardware_queues_h200x2_2026-11-30.md). Timed sends and receives release it at
  // their start all the same: a recorded two-stage pipeline with one connection ran as simulated so
  // (within 1.3%), and holding the queue for a send until its receiver arrives deadlocks schedules
  // that run (NCCL completes a send into the peer's buffers). Its try_start is left to the event of its
  // launch, last dependency or stream predecessor when one of those is still to come: each of them
  // tries it itself (run_host, complete), at this time or later, and the queue's head stays on it until
  // it is released.
  static bool holds_queue_to_end(const ClassState& s, std::uint32_t o) {
    const OpKind k = s.rc->ops[o].kind;
    return s.mark_before[o] >= 0.0 && k != OpKind::send && k != OpKind::recv;
  }
  void advance_hw_queue(std::uint32_t c, std::uint32_t q) {
    ClassState& s = classes_[c];
    std::uint32_t& head = s.hw_head[q];
    const auto released = [&](std::uint32_t o) {
      return s.op[o].start >= 0.0 && (s.end[o] >= 0.0 || !holds_queue_to_end(s, o));
    };
    while (head < s.hw_ops[q].size() && released(s.hw_ops[q][head])) ++head;
    if (head < s.hw_ops[q].size()) {
      const std::uint32_t next = s.hw_ops[q][head];
      const OpState& n = s.op[next];
      if (n.start < 0.0 && n.launch >= 0.0 && n.pending == 0 && s.stream_head[n.queue] == n.stream_pos) {
        push(now_, EventType::op_ready, c, next);
      }
    }
  }

  void start_op(std::uint32_t c, std::uint32_t i) {
    ClassState& s = classes_[c];
    s.op[i].start = now_;
    // A shared start marker (host_lane_costs): when the host came to op i (its start marker's
    // record would have been at mark_host - e), the stream had not yet reached the previous op's end
    // marker, so i starts at that marker and holds its stream for its end marker only.
    if (s.op[i].share_from != kNone && s.op[i].mark_device > 0.0 && s.op[i].mark_host >= 0.0) {
      const std::uint32_t a = s.op[i].share_from;
      if (s.end[a] < 0.0 || s.end[a] > s.op[i].mark_host - host_.event_record.value) {
        s.op[i].shared = 1;
        s.device_extra[i] -= s.op[i].mark_device;
      }
    }
    if (s.op[i].hw_queue != kNone) advance_hw_queue(c, s.op[i].hw_queue);
    const Role role = s.op[i].role;
    if (role == Role::kernel) {
      KernelCosts& k = kernels_[s.kernel[i]];
      if (!k.timed) {
        k.time = coster_.kernel_time(s.rc->ops[i]).value;
        k.sm_fraction = sm_fraction(s.rc->ops[i], sm_count_);
        k.timed = true;
      }
      const double work = checked_cost(k.time * s.compute_factor + s.device_extra[i], g_, *s.rc, i, "kernel time");
      gpu_add(c, i, work);
      return;
    }
    if (role == Role::pcie_copy) {
      const std::uint32_t id = new_instance();
      Instance& inst = instances_[id];
      inst.members.push_back({c, i});
      inst.expected = 1;
      start_instance(id);
      return;
    }
    nccl_phase(c, i, 1);  // resident from here, waiting for its peers until the instance starts
    if (s.rc->ops[i].kind == OpKind::collective) {
      arrive_collective(c, i);
      return;
    }
    arrive_p2p(c, i);
  }

  void complete(std::uint32_t c, std::uint32_t i) {
    ClassState& s = classes_[c];
    s.end[i] = now_;
    ++s.done;
    if (s.nccl_phase[i] != 0) nccl_phase(c, i, 0);
    if (s.op[i].hw_queue != kNone && holds_queue_to_end(s, i)) advance_hw_queue(c, s.op[i].hw_queue);
    if (s.op[i].role != Role::host_lane) {
      const std::uint32_t head = ++s.stream_head[s.op[i].queue];
      const auto& q = s.stream_ops[s.op[i].queue];
      if (head < q.size()) try_start(c, q[head]);
    }
    for (std::uint32_t k = s.rdep_off[i]; k < s.rdep_off[i + 1]; ++k) {
      const std::uint32_t d = s.rdeps[k];
      if (--s.op[d].pending == 0) {
        if (s.host_blocked == d) {
          run_host(c);
        } else {
          try_start(c, d);
        }
      }
    }
  }

  // GPU processor sharing: k kernels together progress at stream_concurrency(k, mean SM fraction)
  // times the speed of one, shared equally.
  double gpu_rate(const ClassState& s) const {
    const std::size_t k = s.active.size();
    if (k <= 1) return 1.0;
    double frac = 0.0;
    for (const Active& a : s.active) frac += a.sm_fraction;
    frac /= static_cast<double>(k);
    const double conc = std::clamp(coster_.stream_concurrency(static_cast<int>(k), frac), 1e-3, static_cast<double>(k));
    return conc / static_cast<double>(k);
  }

  // A kernel beside resident NCCL kernels progresses at the shared rate divided by its slowdown.
  void gpu_update(ClassState& s) {
    const double dt = now_ - s.gpu_last;
    if (dt > 0.0 && !s.active.empty()) {
      const double rate = gpu_rate(s);
      for (Active& a : s.active) a.remaining -= dt * rate / a.slow;
    }
    s.gpu_last = now_;
  }

  void gpu_schedule(std::uint32_t c) {
    ClassState& s = classes_[c];
    ++s.gpu_version;
    if (s.active.empty()) return;
    double least = kInf;
    for (const Active& a : s.active) least = std::min(least, a.remaining * a.slow);
    push(now_ + std::max(0.0, least) / gpu_rate(s), EventType::gpu_done, c, s.gpu_version);
  }

  void gpu_add(std::uint32_t c, std::uint32_t i, double work) {
    ClassState& s = classes_[c];
    gpu_update(s);
    s.active.push_back({i, work, kernels_[s.kernel[i]].sm_fraction});
    s.active.back().slow = nccl_slowdown(s, i);
    gpu_schedule(c);
  }

  // Slowdown of kernel op i of class s's GPU for the NCCL kernels resident now: the larger of the
  // profile's factors of the cases present (pending, transferring); 1 with none resident
  // (nccl_resident_factor).
  double nccl_slowdown(const ClassState& s, std::uint32_t i) {
    if (!nccl_residency_) return 1.0;
    const bool pending = s.nccl_pending > 0 || opt_.pending_receive_throughout;
    const bool transferring = s.nccl_transfer > 0;
    if (!pending && !transferring) return 1.0;
    KernelCosts& k = kernels_[s.kernel[i]];
    if (!k.resident_known) {
      const Op& op = s.rc->ops[i];
      k.slow_pending = coster_.nccl_resident_slowdown(0, compute_class(op), gemm_tiles(op));
      k.slow_transfer = coster_.nccl_resident_slowdown(1, compute_class(op), gemm_tiles(op));
      k.resident_known = true;
    }
    return resident_factor(k.slow_pending, k.slow_transfer, pending, transferring);
  }

  // Moves op i of class c to residency phase `phase` (0 none, 1 pending, 2 transferring); when the
  // class's resident set changes, the running kernels continue at their new rates.
  void nccl_phase(std::uint32_t c, std::uint32_t i, std::uint8_t phase) {
    ClassState& s = classes_[c];
    std::uint8_t& cur = s.nccl_phase[i];
    if (cur == phase) return;
    const bool before_p = s.nccl_pending > 0, before_t = s.nccl_transfer > 0;
    if (cur == 1) --s.nccl_pending;
    if (cur == 2) --s.nccl_transfer;
    if (phase == 1) ++s.nccl_pending;
    if (phase == 2) ++s.nccl_transfer;
    cur = phase;
    if (!nccl_residency_ || s.active.empty()) return;
    if (before_p == (s.nccl_pending > 0) && before_t == (s.nccl_transfer > 0)) return;
    gpu_update(s);
    for (Active& a : s.active) a.slow = nccl_slowdown(s, a.op);
    gpu_schedule(c);
  }

  void gpu_event(std::uint32_t c, std::uint64_t version) {
    ClassState& s = classes_[c];
    if (version != s.gpu_version) return;
    gpu_update(s);
    // Kernels whose work is done (to rounding) finish now, in the order they started. `finished_`
    // is a stack shared by nested calls (complete may come back here): this call's ops are those
    // past `base`, popped when they are done.
    const std::size_t base = finished_.size();
    double least = kInf;
    for (const Active& a : s.active) least = std::min(least, a.remaining * a.slow);
    const double tol = 1e-12 + 1e-9 * std::max(0.0, least);
    keep_.clear();
    for (const Active& a : s.active) {
      if (a.remaining * a.slow <= least + tol) {
        finished_.push_back(a.op);
      } else {
        keep_.push_back(a);
      }
    }
    s.active.swap(keep_);
    gpu_schedule(c);
    for (std::size_t k = base; k < finished_.size(); ++k) complete(c, finished_[k]);
    finished_.resize(base);
  }

  // ---------------------------------------------------------------- communication
  std::uint32_t new_instance() {
    instances_.emplace_back();
    return static_cast<std::uint32_t>(instances_.size() - 1);
  }

  // Classes of the members of `c`'s representative's group `g` (sorted, unique), interned.
  std::uint32_t member_set(std::uint32_t c, Group g) {
    const std::uint64_t key = (static_cast<std::uint64_t>(c) << 8) | static_cast<std::uint64_t>(g);
    auto it = set_of_.find(key);
    if (it != set_of_.end()) return it->second;
    const auto& members = group_members(c, g);
    std::vector<std::uint32_t> cls;
    cls.reserve(members.size());
    for (int r : members) cls.push_back(static_cast<std::uint32_t>(g_.class_of_rank.at(static_cast<std::size_t>(r))));
    std::sort(cls.begin(), cls.end());
    cls.erase(std::unique(cls.begin(), cls.end()), cls.end());
    std::uint32_t id = 0;
    auto found = std::find(sets_.begin(), sets_.end(), cls);
    if (found == sets_.end()) {
      sets_.push_back(cls);
      id = static_cast<std::uint32_t>(sets_.size() - 1);
    } else {
      id = static_cast<std::uint32_t>(found - sets_.begin());
    }
    set_of_.emplace(key, id);
    return id;
  }

  const std::vector<int>& group_members(std::uint32_t c, Group g) {
    const std::uint64_t key = (static_cast<std::uint64_t>(c) << 8) | static_cast<std::uint64_t>(g);
    auto it = members_of_.find(key);
    if (it != members_of_.end()) return it->second;
    return members_of_.emplace(key, g_.layout.group_members(g, classes_[c].rep)).first->second;
  }

  void arrive_collective(std::uint32_t c, std::uint32_t i) {
    const ClassState& s = classes_[c];
    const Op& op = s.rc->ops[i];
    if (op.group == Group::none) {
      throw InputError(describe_op(g_, *s.rc, i) + ": a collective without a process group");
    }
    const std::uint32_t set = member_set(c, op.group);
    CollKey key = base_key(op);
    key.occurrence = s.occurrence[i];
    key.set = set;
    auto it = pending_coll_.find(key);
    std::uint32_t id = 0;
    if (it == pending_coll_.end()) {
      id = new_instance();
      instances_[id].expected = sets_[set].size();
      instances_[id].members.reserve(instances_[id].expected);
      pending_coll_.emplace(key, id);
    } else {
      id = it->second;
    }
    Instance& inst = instances_[id];
    for (const Member& m : inst.members) {
      if (m.cls == c) {
        throw InputError(describe_op(g_, *s.rc, i) + ": issued twice for the same collective instance");
      }
    }
    inst.members.push_back({c, i});
    if (inst.members.size() == inst.expected) {
      pending_coll_.erase(key);
      start_instance(id);
    }
  }

  void arrive_p2p(std::uint32_t c, std::uint32_t i) {
    const ClassState& s = classes_[c];
    const Op& op = s.rc->ops[i];
    if (op.peer == 0) throw InputError(describe_op(g_, *s.rc, i) + ": point-to-point op without a peer direction");
    const int peer = g_.layout.peer_of(op, s.rep);
    const auto peer_class = static_cast<std::uint32_t>(g_.class_of_rank.at(static_cast<std::size_t>(peer)));
    const bool send = op.kind == OpKind::send;
    const std::uint32_t sender = send ? c : peer_class;
    const std::uint32_t receiver = send ? peer_class : c;
    // Data flows towards the next stage (+1) or the previous one (-1): a send's peer, a recv's
    // opposite. Forward and backward transfers of one pair can share a tag (interleaved schedules).
    const P2pKey key{sender, receiver, op.tag, static_cast<std::int8_t>(send ? op.peer : -op.peer),
                     static_cast<std::uint8_t>(op.group)};
    auto it = pending_p2p_.find(key);
    if (it == pending_p2p_.end()) {
      const std::uint32_t id = new_instance();
      Instance& inst = instances_[id];
      inst.p2p = true;
      inst.expected = 2;
      inst.members.reserve(2);
      inst.members.push_back({c, i});
      pending_p2p_.emplace(key, id);
      return;
    }
    const std::uint32_t id = it->second;
    Instance& inst = instances_[id];
    const Op& other = classes_[inst.members[0].cls].rc->ops[inst.members[0].op];
    if (other.kind == op.kind) {
      throw InputError(describe_op(g_, *s.rc, i) + ": a second " + scenarios::to_string(op.kind) +
                       " with the same tag before the matching " + (send ? "recv" : "send"));
    }
    inst.members.push_back({c, i});
    pending_p2p_.erase(it);
    start_instance(id);
  }

  // The sending member of a p2p instance first.
  void order_p2p(Instance& inst) {
    if (inst.members.size() == 2 && classes_[inst.members[0].cls].rc->ops[inst.members[0].op].kind != OpKind::send) {
      std::swap(inst.members[0], inst.members[1]);
    }
  }

  void start_instance(std::uint32_t id) {
    Instance& inst = instances_[id];
    ++collectives_;
    // Every member has arrived: their NCCL kernels stop waiting and transfer.
    for (const Member& m : inst.members) {
      if (classes_[m.cls].nccl_phase[m.op] == 1) nccl_phase(m.cls, m.op, 2);
    }
    const Plan& plan = plan_for(inst);
    if (opt_.fidelity == Fidelity::analytic || plan.flows.empty() || plan.negligible) {
      double end = now_ + plan.lone;
      const Member& m = inst.members[0];
      const Op& op = classes_[m.cls].rc->ops[m.op];
      if (opt_.fidelity == Fidelity::analytic && is_pcie_copy(op)) {
        // Without flows, copies of one GPU's PCIe link in one direction queue on it (several copy
        // streams share the link's bandwidth, they do not multiply it).
        const bool h2d = op.copy_kind() == CopyKind::h2d_pinned || op.copy_kind() == CopyKind::h2d_pageable;
        double& free = pcie_free_[(static_cast<std::uint64_t>(m.cls) << 1) | (h2d ? 1U : 0U)];
        end = std::max(now_, free) + plan.lone;
        free = end;
      }
      push(end, EventType::instance_done, 0, id);
      return;
    }
    inst.flows = &plan.flows;
    if (plan.latency > 0.0) {
      push(now_ + plan.latency, EventType::instance_post, 0, id);
    } else {
      post_instance(id);
    }
  }

  void post_instance(std::uint32_t id) {
    Instance& inst = instances_[id];
    if (engine_->now() < now_) {
      std::vector<std::uint64_t> none;
      engine_->advance(now_, none);
      if (!none.empty()) throw std::logic_error("flow engine completed a group while it was idle");
    }
    engine_->start_group(id, *inst.flows);
    flows_started_ += inst.flows->size();
    inst.flows = nullptr;
  }

  void finish_instance(std::uint32_t id) {
    // Taken out (a finished instance is not looked at again): completing members may start new
    // instances and grow instances_.
    const std::vector<Member> members = std::move(instances_[id].members);
    for (const Member& m : members) complete(m.cls, m.op);
  }

  // ---------------------------------------------------------------- plans
  const Plan& plan_for(Instance& inst) {
    std::string& key = plan_key_;
    key.clear();
    auto put = [&](auto v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
    if (inst.p2p) order_p2p(inst);
    const Op& first = classes_[inst.members[0].cls].rc->ops[inst.members[0].op];
    put(static_cast<std::uint8_t>(first.kind));
    for (const Member& m : inst.members) {
      const Op& op = classes_[m.cls].rc->ops[m.op];
      put(m.cls);
      put(op.bytes);
      put(op.shape[0]);
      put(op.shape[1]);
      put(op.sub);
      put(static_cast<std::uint8_t>(op.group));
      put(op.peer);
    }
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    Plan plan;
    if (first.kind == OpKind::copy) {
      plan = plan_copy(inst);
    } else if (inst.p2p) {
      plan = plan_p2p(inst);
    } else {
      plan = plan_collective(inst);
    }
    return plans_.emplace(key, std::move(plan)).first->second;
  }

  // Scales the bytes of the plan's flows by one common factor so that, alone, they end after
  // max(t_bw, their own makespan): the profile's time unless the platform is slower
  // (docs/simulator.md, "Collectives as flows").
  void finish_plan(Plan& plan, double t_bw) {
    double makespan = 0.0;
    if (!plan.flows.empty()) {
      for (const PlacedFlow& f : plan.flows) {
        if (f.links.empty() || !(f.bytes > 0.0)) throw std::logic_error("a planned flow without route or bytes");
      }
      makespan = lone_makespan(plan.flows, capacity_);
      if (makespan > 0.0 && makespan < t_bw) {
        const double k = t_bw / makespan;
        for (PlacedFlow& f : plan.flows) f.bytes *= k;
      }
      // SimGrid moves whole bytes and never completes an empty transfer: a sliver of an uneven
      // all-to-all carries at least one byte (picoseconds at these bandwidths).
      for (PlacedFlow& f : plan.flows) f.bytes = std::max(f.bytes, 1.0);
    }
    plan.lone = plan.latency + std::max(t_bw, makespan);
    plan.negligible = !plan.flows.empty() && std::max(t_bw, makespan) < kNegligibleTransferS;
  }

  PlacedFlow place(int src, int dst, double bytes) const {
    const auto [a, b] = platform_.gpu_endpoints(src, dst);
    PlacedFlow f{a, b, bytes, {}};
    platform_.route(a, b, f.links);
    return f;
  }

  Plan plan_copy(const Instance& inst) {
    const ClassState& s = classes_[inst.members[0].cls];
    const Op& op = s.rc->ops[inst.members[0].op];
    Plan plan;
    const double t =
        checked_cost(coster_.copy_time(op.copy_kind(), Bytes(op.bytes)).value + s.device_extra[inst.members[0].op], g_,
                     *s.rc, inst.members[0].op, "copy time");
    if (!(op.bytes > 0.0)) {
      plan.latency = t;
      plan.lone = t;
      return plan;
    }
    const bool h2d = op.copy_kind() == CopyKind::h2d_pinned || op.copy_kind() == CopyKind::h2d_pageable;
    const Endpoint host{PortKind::host, platform_.node_of(s.rep)};
    const Endpoint gpu{PortKind::gpu_pcie, s.rep};
    PlacedFlow f{h2d ? host : gpu, h2d ? gpu : host, op.bytes, {}};
    platform_.route(f.src, f.dst, f.links);
    plan.flows.push_back(std::move(f));
    finish_plan(plan, t);
    return plan;
  }

  Plan plan_p2p(const Instance& inst) {
    const Member& sm = inst.members[0];
    const ClassState& s = classes_[sm.cls];
    const Op& op = s.rc->ops[sm.op];
    const int dst = g_.layout.peer_of(op, s.rep);
    Plan plan;
    const bool same_node = platform_.node_of(s.rep) == platform_.node_of(dst);
    const CommParams p = coster_.comm_params(Collective::send_recv, Bytes(op.bytes), 2,
                                             same_node ? LinkScope::nvlink : LinkScope::network);
    checked_cost(p.latency.value, g_, *s.rc, sm.op, "latency");
    checked_cost(p.bus_bandwidth.value, g_, *s.rc, sm.op, "bus bandwidth");
    const auto [a, b] = platform_.gpu_endpoints(s.rep, dst);
    plan.latency = std::max(p.latency.value, s.rep == dst ? 0.0 : platform_.route_latency(a, b).value);
    const double t_bw = p.bus_bandwidth.value > 0.0 ? op.bytes / p.bus_bandwidth.value : 0.0;
    if (op.bytes > 0.0 && s.rep != dst) plan.flows.push_back(place(s.rep, dst, op.bytes));
    finish_plan(plan, t_bw);
    return plan;
  }

  Split split_for(const Op& op, std::size_t n) const {
    Split split;
    if (op.collective() != Collective::all_to_all) return split;
    const std::int64_t routed = op.shape[1];
    if (routed == 0) return split;
    split.kind = routed == 1 ? SplitKind::by_dest : SplitKind::by_src;
    const scenarios::RoutingModel model(static_cast<int>(n), opt_.routing_imbalance);
    split.share.resize(n);
    for (std::size_t j = 0; j < n; ++j) split.share[j] = model.share(static_cast<int>(j));
    return split;
  }

  // Bus-bandwidth time of an all-to-all whose group spans nodes (docs/simulator.md, "Expert dispatch
  // across nodes"): the bytes each member sends or receives within its node on the NVLink curve (group
  // size: the members of its node), the bytes to and from other nodes on the network curve (group size:
  // all members), both at once; the slower member and link sets the time. A flex dispatch or combine
  // de-duplicates the network bytes per destination node, sends them at the profile's RDMA dispatch
  // bandwidth (dispatch.flex.network) when it has one, and forwards them over NVLink; the flows of
  // `raw` to other nodes are scaled by the same factor.
  double a2a_across_nodes(const Op& op, std::span<const int> members, double size, const Split& split, int rep,
                          std::vector<RankFlow>& raw) const {
    const int n = static_cast<int>(members.size());
    const bool flex = opt_.dispatch.kind == DispatchKind::flex && op.group == scenarios::Group::ep && op.shape[1] != 0;
    // A flex dispatch's network bytes go at the profile's RDMA dispatch bandwidth when it has one,
    // divided by DeepEP's byte count per network byte of the member's node (rdma_count_factor).
    const std::optional<BytesPerSecond> flex_bw =
        flex ? coster_.expert_dispatch_bandwidth(n, op.shape[1] == 2) : std::nullopt;
    std::vector<double> dedup;
    std::vector<double> counted;
    if (flex) {
      std::vector<int> experts = members_per_node(members, platform_);
      for (int& e : experts) e = e * opt_.dispatch.num_experts / n;
      for (std::size_t m = 0; m < experts.size(); ++m) {
        dedup.push_back(dedup_factor(opt_.dispatch, experts, m));
        if (flex_bw) counted.push_back(rdma_count_factor(opt_.dispatch, experts, m));
      }
    }
    const A2aByLink by_link = a2a_by_link(members, size, split, platform_, dedup);
    double t = 0.0;
    for (std::size_t i = 0; i < by_link.members.size(); ++i) {
      const A2aLinkBytes& b = by_link.members[i];
      const int local = by_link.members_per_node[static_cast<std::size_t>(b.node)];
      if (local > 1 && b.nvlink > 0.0) {
        const CommParams nv =
            coster_.comm_params(Collective::all_to_all, Bytes(op.bytes * local / n), local, LinkScope::nvlink);
        if (nv.bus_bandwidth.value > 0.0) t = std::max(t, b.nvlink / nv.bus_bandwidth.value);
      }
      if (b.network > 0.0) {
        const double bw = flex_bw ? flex_bw->value / counted[static_cast<std::size_t>(b.node)]
                                  : coster_.comm_params(Collective::all_to_all, Bytes(op.bytes), n, LinkScope::network)
                                        .bus_bandwidth.value;
        if (bw > 0.0) t = std::max(t, b.network / bw);
      }
    }
    if (flex) {
      const auto it = std::find(members.begin(), members.end(), rep);
      const int own = by_link.members[static_cast<std::size_t>(it - members.begin())].node;
      for (RankFlow& f : raw) {
        if (platform_.node_of(f.dst) != platform_.node_of(f.src)) f.bytes *= dedup[static_cast<std::size_t>(own)];
      }
    }
    return t;
  }

  Plan plan_collective(const Instance& inst) {
    Plan plan;
    double t_bw = 0.0;
    std::vector<RankFlow> placed;
    std::vector<int> flow_class_start;
    for (const Member& m : inst.members) {
      const ClassState& s = classes_[m.cls];
      const Op& op = s.rc->ops[m.op];
      const std::vector<int>& members = group_members(m.cls, op.group);
      const int n = static_cast<int>(members.size());
      if (op.group_size != n) {
        throw InputError(describe_op(g_, *s.rc, m.op) + ": group_size " + std::to_string(op.group_size) +
                         " but the layout's group has " + std::to_string(n) + " members");
      }
      if (n <= 1) continue;
      const Collective kind = op.collective();
      const Split split = split_for(op, members.size());
      // by_src splits are given the balanced size (shape[0]); other kinds use the op's bytes.
      const double size = split.kind == SplitKind::uniform ? op.bytes : static_cast<double>(op.shape[0]);
      const bool spans = !g_.layout.group_within_node(op.group, s.rep);
      const Algorithm algo = choose_algorithm(kind, opt_.allreduce, spans, op.bytes, n);
      const CommParams p =
          coster_.comm_params(kind, Bytes(op.bytes), n, spans ? LinkScope::network : LinkScope::nvlink);
      checked_cost(p.latency.value, g_, *s.rc, m.op, "latency");
      checked_cost(p.bus_bandwidth.value, g_, *s.rc, m.op, "bus bandwidth");
      const int gpn = platform_.gpus_per_node();
      std::vector<RankFlow> raw = collective_flows(kind, algo, members, size, split, s.rep, gpn);
      if (kind == Collective::all_to_all && spans) {
        t_bw = std::max(t_bw, a2a_across_nodes(op, members, size, split, s.rep, raw));
      } else if (const int rails = spans ? rails_of(members, gpn) : 1; rails > 1) {
        const CommParams nv = coster_.comm_params(kind, Bytes(op.bytes), rails, LinkScope::nvlink);
        const double traffic = bus_traffic_bytes(kind, members, size, split);
        t_bw = std::max(t_bw, rails_bus_time(traffic, rails, p.bus_bandwidth.value, nv.bus_bandwidth.value));
      } else {
        const double traffic = bus_traffic_bytes(kind, members, size, split);
        if (p.bus_bandwidth.value > 0.0) t_bw = std::max(t_bw, traffic / p.bus_bandwidth.value);
      }
      double path_latency = 0.0;
      for (const RankFlow& f : raw) {
        const auto [a, b] = platform_.gpu_endpoints(f.src, f.dst);
        path_latency = std::max(path_latency, platform_.route_latency(a, b).value);
      }
      plan.latency = std::max({plan.latency, p.latency.value, latency_hops(kind, algo, n) * path_latency});
      for (const RankFlow& f : aggregate_flows(raw, members, platform_)) placed.push_back(f);
    }
    for (const RankFlow& f : placed) plan.flows.push_back(place(f.src, f.dst, f.bytes));
    finish_plan(plan, t_bw);
    return plan;
  }

  // ---------------------------------------------------------------- end
  void check_finished() const {
    for (const ClassState& s : classes_) {
      if (s.done == s.rc->ops.size()) continue;
      // The first op that never finished, and why.
      for (std::uint32_t i = 0; i < s.rc->ops.size(); ++i) {
        if (s.end[i] >= 0.0) continue;
        std::string why;
        const Op& op = s.rc->ops[i];
        if (s.op[i].start >= 0.0 && (op.kind == OpKind::collective)) {
          why = "it waits for the other rank classes of its " + std::string(scenarios::to_string(op.group)) +
                " group to issue the same collective";
        } else if (s.op[i].start >= 0.0 && (op.kind == OpKind::send || op.kind == OpKind::recv)) {
          why = std::string("it waits for the matching ") + (op.kind == OpKind::send ? "recv" : "send") +
                " (same tag) of its peer";
        } else if (s.op[i].pending > 0) {
          why = "it waits for " + std::to_string(s.op[i].pending) + " dependencies that never finished";
        } else if (!on_host_lane(op) && s.stream_head[s.op[i].queue] != s.op[i].stream_pos) {
          why = "an earlier op of its stream '" + g_.streams[op.stream].name + "' never finished";
        } else {
          why = "it was never launched";
        }
        throw InputError("the step cannot finish (deadlock): " + describe_op(g_, *s.rc, i) + " never ran to the end: " + why);
      }
    }
  }

  StepResult collect() {
    StepResult r;
    r.epoch = epoch_;
    r.collectives = collectives_;
    r.flows_started = flows_started_;
    r.classes.resize(classes_.size());
    double last = epoch_;
    for (std::size_t c = 0; c < classes_.size(); ++c) {
      ClassState& s = classes_[c];
      ClassTimeline& t = r.classes[c];
      // The timeline takes the storage of the class's set-up arrays, which hold one double per op and
      // are not read here (every element is written below): the step's last use of them.
      t.start = std::move(s.host_arrive);
      t.end = std::move(s.host_cost);
      t.start.resize(s.op.size());
      t.end.resize(s.end.size());
      // An untimed class's records are its ops' device execution: no record times of their own (no op
      // has a timing marker, host_lane_costs).
      const bool timed = s.timing != Timing::none;
      if (timed) {
        t.record_start = std::move(s.host_post);
        t.record_end = std::move(s.device_extra);
        t.launch_wait = std::move(s.mark_before);
        t.record_start.resize(s.op.size());
        t.record_end.resize(s.end.size());
        t.launch_wait.assign(s.op.size(), 0.0);
      }
      double class_end = epoch_;
      for (std::size_t i = 0; i < s.op.size(); ++i) {
        t.start[i] = s.op[i].start - epoch_;
        t.end[i] = s.end[i] - epoch_;
        class_end = std::max(class_end, s.end[i]);
        if (!timed) continue;
        t.record_start[i] = t.start[i];
        t.record_end[i] = t.end[i];
        if (s.op[i].mark_host < 0.0 && s.op[i].mark_device > 0.0 && s.op[i].start >= 0.0) {
          // An op of a timed graph replay: its record starts once its start-marker node ran and ends
          // with its end-marker node (duration = kernel + node + one marker; the next op's start
          // marker is the gap between records), as eager timed ops (timed_op_gap).
          t.record_start[i] = std::min(t.start[i] + s.op[i].mark_device, t.end[i]);
        }
        if (s.op[i].mark_host >= 0.0 && s.op[i].start >= 0.0) {
          // The start marker runs once the host has recorded it and the stream has reached it (its
          // earlier work and the waits before it are done), its timestamp taken after its own device
          // time; the end marker once the op is done and the host has recorded it behind the launch.
          // On an idle stream the marker runs when the host records it, so the host's work between
          // the marker and the launch is inside the record (a CUDA event on an idle stream completes
          // at its record call, not at the next launch); behind a busy stream the record covers the
          // kernel and the end marker (timed_op_gap: duration +1 marker, gap 1 marker).
          const double ready = s.op[i].ready >= 0.0 ? std::min(s.op[i].ready, s.op[i].start) : s.op[i].start;
          t.record_start[i] =
              std::min(std::min(std::max(s.op[i].mark_host, ready), s.op[i].start) + s.op[i].mark_device, s.end[i]) -
              epoch_;
          t.record_end[i] = std::max(s.end[i], s.mark_end_host[i]) - epoch_;
          if (s.op[i].shared) {  // start(i) = end(previous op on the stream): its end marker's time
            const std::uint32_t a = s.op[i].share_from;
            t.record_start[i] = std::min(std::max(s.end[a], s.mark_end_host[a]) - epoch_, t.start[i]);
          }
          // The part of the record before the host's launch call returned: the device waited for
          // the host (threewalls run measures the same: launch return on the host clock minus the
          // record's start).
          if (!s.rc->ops[i].is_comm() && s.op[i].launch >= 0.0) {
            t.launch_wait[i] = std::clamp(s.op[i].launch - epoch_ - t.record_start[i], 0.0,
                                          std::max(0.0, t.record_end[i] - t.record_start[i]));
          }
        }
      }
      t.step_end = std::max(class_end, s.host_end) - epoch_;
      last = std::max({last, class_end, s.host_end});
    }
    r.duration = last - epoch_;
    return r;
  }

  const OpCoster& coster_;
  const ExecutorOptions& opt_;
  const StepGraph& g_;
  const Platform& platform_;
  double epoch_;
  FlowEngine* engine_;
  HostCosts host_;
  int sm_count_ = 0;
  bool nccl_residency_ = false;  // the coster models compute beside resident NCCL kernels
  std::vector<double> capacity_;
  std::vector<ClassState> classes_;
  EventQueue queue_;
  std::uint64_t seq_ = 0;
  double now_ = 0.0;
  std::vector<Instance> instances_;
  // gpu_event's scratch: the kernels that finish (a stack over nested calls) and those that go on.
  std::vector<std::uint32_t> finished_;
  std::vector<Active> keep_;
  std::unordered_map<CollKey, std::uint32_t, CollKeyHash> pending_coll_;
  std::unordered_map<P2pKey, std::uint32_t, P2pKeyHash> pending_p2p_;
  std::unordered_map<std::uint64_t, std::uint32_t> set_of_;
  std::vector<std::vector<std::uint32_t>> sets_;
  std::unordered_map<std::uint64_t, std::vector<int>> members_of_;
  std::unordered_map<std::string, Plan> plans_;
  // The distinct kernels of the step (kernel_of) and their open-addressing table.
  std::vector<KernelCosts> kernels_;
  std::vector<std::uint32_t> kernel_slots_;
  std::string plan_key_;                                 // plan_for's key
  std::unordered_map<std::uint64_t, double> pcie_free_;  // analytic fidelity: (class, direction) -> link free at
  std::size_t collectives_ = 0;
  std::size_t flows_started_ = 0;
};

}  // namespace

Executor::Executor(const OpCoster& coster, ExecutorOptions options) : coster_(coster), options_(options) {}

std::vector<int> Executor::flow_ranks(const StepGraph& graph) const {
  // Mirrors the flows StepRun places (plan_copy, plan_p2p, plan_collective): each from the
  // representative of the class whose op it is. Ops the executor refuses are left to it.
  std::vector<int> ranks;
  std::unordered_map<std::uint64_t, std::uint8_t> seen;  // (class, group, kind, algorithm) done
  for (std::size_t c = 0; c < graph.classes.size(); ++c) {
    const RankClass& rc = graph.classes[c];
    const int rep = rc.representative();
    if (rep < 0) continue;
    ranks.push_back(rep);
    // The representative's groups: members and whether they span nodes, by group.
    struct GroupOfRep {
      bool known = false;
      bool spans = false;
      std::vector<int> members;
    };
    std::unordered_map<std::uint8_t, GroupOfRep> groups;
    for (const Op& op : rc.ops) {
      if (op.kind == OpKind::send || op.kind == OpKind::recv) {
        if (op.peer != 0) ranks.push_back(graph.layout.peer_of(op, rep));
        continue;
      }
      if (op.kind != OpKind::collective || op.group == Group::none) continue;
      GroupOfRep& grp = groups[static_cast<std::uint8_t>(op.group)];
      if (!grp.known) {
        grp.known = true;
        grp.members = graph.layout.group_members(op.group, rep);
        grp.spans = !graph.layout.group_within_node(op.group, rep);
      }
      const std::vector<int>& members = grp.members;
      const int n = static_cast<int>(members.size());
      if (n <= 1) continue;
      const Collective kind = op.collective();
      const bool spans = grp.spans;
      const Algorithm algo = choose_algorithm(kind, options_.allreduce, spans, op.bytes, n);
      const std::uint64_t key = (static_cast<std::uint64_t>(c) << 24) | (static_cast<std::uint64_t>(op.group) << 16) |
                                (static_cast<std::uint64_t>(kind) << 8) | static_cast<std::uint64_t>(algo);
      if (!seen.try_emplace(key, 1).second) continue;
      for (const RankFlow& f : collective_flows(kind, algo, members, 1.0, Split{}, rep, graph.layout.gpus_per_node()))
        ranks.push_back(f.dst);
    }
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

StepResult Executor::run_step(const StepGraph& graph, const Platform& platform, std::span<const double> compute_factor,
                              double epoch, FlowEngine* engine, std::span<const Timing> timing) const {
  if (!compute_factor.empty() && compute_factor.size() != graph.classes.size()) {
    throw std::logic_error("compute_factor must have one entry per rank class");
  }
  if (!timing.empty() && timing.size() != graph.classes.size()) {
    throw std::logic_error("timing must have one entry per rank class");
  }
  StepRun run(coster_, options_, graph, platform, compute_factor, timing, epoch, engine);
  return run.run();
}

}  // namespace threewalls::sim
