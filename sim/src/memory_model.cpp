// Memory model: equations in docs/memory_model.md (each block below names its section).
#include "threewalls/sim/memory_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "threewalls/scenarios/graph_scopes.hpp"
#include "threewalls/scenarios/layout.hpp"
#include "threewalls/scenarios/parameters.hpp"

namespace threewalls::sim {

namespace {

using scenarios::AttentionKind;
using scenarios::Op;
using scenarios::OpKind;
using scenarios::ModelSpec;
using scenarios::Scenario;

using Dims = scenarios::ModelDims;
using scenarios::model_dims;
using scenarios::residual_bytes;
using scenarios::tokens_per_microbatch;

}  // namespace

double training_bytes_per_parameter(bool distributed_optimizer, int dp) {
  // bf16 weight 2 + fp32 gradient 4 + fp32 master weight, Adam m and v 4 + 4 + 4.
  return distributed_optimizer ? 6.0 + 12.0 / std::max(1, dp) : 18.0;
}

int inflight_chunk_microbatches(int pp, int vpp, int stage, int microbatches, bool ep_overlap) {
  // With the expert-parallel overlap (combined 1F1B) a forward runs beside the backward of an earlier
  // micro-batch, before that backward frees its activations: one more chunk-micro-batch in flight
  // (Megatron adds one warm-up micro-batch to the interleaved schedule for it).
  const int extra = ep_overlap ? 1 : 0;
  if (vpp <= 1) return std::max(1, std::min(pp - stage + extra, microbatches));
  const int warmup = 2 * (pp - stage - 1) + (vpp - 1) * pp + extra;
  return std::max(1, std::min(warmup + 1, microbatches * vpp));
}

bool MemoryReport::oom() const { return first_oom_class() >= 0; }

int MemoryReport::first_oom_class() const {
  for (const ClassMemory& c : classes) {
    if (c.peak() > gpu_memory) return c.id;
  }
  return -1;
}

namespace {

// What threewalls run's OpRunners of a rank hold: the CUDA context and modules once, and per device
// stream with ops an OpRunner (backend/src/cuda_device.cpp, prepare_stream) with its cuBLASLt handle
// and workspace, a cuDNN handle where it runs fused attention, and operand buffers sized for the ops
// queued on that stream (docs: "Buffers"). Measured (opt.device, the profile's device.memory): the
// context, modules, first and further cuBLASLt handles and cuDNN handles at their measured bytes.
// Without it: kCudaContextBytes for the process and the first runner, kOpRunnerWorkspaceBytes per
// further one. Operand buffers: the bytes of the largest op of every stream, leaving out the ops that
// work on the parameter state (scenarios::works_on_parameter_state: optimizer, gradient norm,
// data-parallel collectives).
double runner_bytes(const Scenario& s, const scenarios::RankClass& rc, const MemoryOptions& opt) {
  struct Stream {
    double largest = 0.0;
    bool fused_attention = false;
  };
  std::map<int, Stream> streams;
  for (const Op& op : runner_ops(s, rc.ops)) {
    Stream& st = streams[op.stream];
    st.largest = std::max(st.largest, operand_bytes(s, op));  // a handful of ops: one or two per stream
    st.fused_attention = st.fused_attention || (op.kind == OpKind::attention &&
                                                scenarios::attention_kernel(op) != scenarios::AttentionKernel::unfused);
  }
  // A class without ops still has its process and first runner.
  if (streams.empty()) streams[0] = Stream{};
  const double further = static_cast<double>(streams.size() - 1);
  double total = 0.0;
  if (opt.device) {
    const DeviceMemoryParams& d = *opt.device;
    total += d.context.value + d.modules.value + d.blas.value + further * d.blas_further.value;
    for (const auto& [id, st] : streams) total += st.fused_attention ? d.cudnn.value : 0.0;
  } else {
    total += kCudaContextBytes + further * kOpRunnerWorkspaceBytes;
  }
  for (const auto& [id, st] : streams) total += st.largest;
  return total;
}

// NCCL communicators this rank belongs to, and all-to-all peers (docs: "Buffers").
double nccl_bytes(const Scenario& s, const scenarios::Layout& L) {
  double bytes = 0.0;
  for (scenarios::Group g : {scenarios::Group::tp, scenarios::Group::cp, scenarios::Group::dp_cp, scenarios::Group::ep,
                             scenarios::Group::etp, scenarios::Group::edp, scenarios::Group::pp}) {
    const int n = L.group_size(g);
    if (n > 1) bytes += kNcclBytesPerCommunicator;
  }
  if (s.model.is_moe() && s.parallel.ep > 1) bytes += (s.parallel.ep - 1) * kNcclBytesPerPeer;
  return bytes;
}

// Device bytes of the p2p connections with one peer (docs/memory_model.md, "NCCL buffers per peer").
// NCCL connects a peer on the first send or receive with it, over p2pnChannelsPerPeer channels, the
// smallest channel count of any peer of the communicator (src/graph/paths.cc). An NVLink peer of a
// communicator within one node: the measured p2p_peer_bytes (that many channels, each a 4 MiB
// SIMPLE send buffer and the LL + LL128 receive buffers, each rounded up to 2 MiB: 12 MiB). An NVLink
// peer of a communicator that spans nodes gets the network peers' channel count
// (kNcclNetChannelsPerPeer, halved while channels x ceil(ranks / 8) exceed kNcclP2pChannels) at 12
// MiB each, at most the measured bytes. A network peer: its SIMPLE traffic goes through the
// communicator's shared pool (kNcclNetSharedPoolBytes, counted once per communicator) and its
// per-connection structures live in host memory: no device bytes per peer.
double nccl_p2p_peer_bytes(const NcclMemoryParams& m, bool network_peer, bool communicator_spans_nodes,
                           int communicator_ranks) {
  if (network_peer) return 0.0;
  if (!communicator_spans_nodes) return m.p2p_peer.value;
  int channels = kNcclNetChannelsPerPeer;
  const int batches = (communicator_ranks + 7) / 8;
  while (channels > 1 && channels * batches > kNcclP2pChannels) channels /= 2;
  return std::min(m.p2p_peer.value, channels * kNcclP2pChannelBytes);
}

// NCCL memory from the calibration's nccl.memory points (docs/memory_model.md, "Buffers"), counted
// the way threewalls run creates communicators (backend/cuda_device.hpp): one per (group, stream)
// of the class's collectives, each communicator_bytes + collective_bytes; one two-rank communicator
// per directed pair (peer, send or receive) of its send/recv ops, communicator_bytes each; and the
// p2p connection buffers of every (group, peer) the class sends to or receives from, all-to-all
// peers included (NCCL runs all-to-all over the same p2p connections: n - 1 peers per all-to-all
// group of n ranks), by where the peer is (nccl_p2p_peer_bytes).
double nccl_bytes_measured(const scenarios::Layout& L, int rep, const std::vector<Op>& ops, const NcclMemoryParams& m) {
  // The distinct communication ops first: a class repeats each per layer and micro-batch, so each
  // op is first looked up in bitmaps of what was seen (group and stream are bytes, peer a signed byte).
  std::set<std::pair<int, int>> coll_comms;      // (group, stream)
  std::set<int> a2a_groups;                      // groups of all-to-alls
  std::set<std::tuple<int, int, bool>> p2p_ops;  // (group, peer offset, send)
  constexpr std::size_t kByte = 256;
  std::vector<bool> seen_coll(kByte * kByte), seen_a2a(kByte), seen_p2p(kByte * kByte * 2);
  std::array<int, kByte> group_size{};  // 0: not yet asked
  for (const auto& op : ops) {
    const auto g = static_cast<std::size_t>(op.group);
    if (op.kind == OpKind::collective && op.group != scenarios::Group::none) {
      const std::size_t coll = g * kByte + op.stream;
      const bool a2a = op.collective() == scenarios::Collective::all_to_all;
      if (seen_coll[coll] && (!a2a || seen_a2a[g])) continue;
      if (group_size[g] == 0) group_size[g] = L.group_size(op.group);
      if (group_size[g] <= 1) continue;
      seen_coll[coll] = true;
      coll_comms.insert({static_cast<int>(op.group), op.stream});
      if (a2a) {
        seen_a2a[g] = true;
        a2a_groups.insert(static_cast<int>(op.group));
      }
    } else if ((op.kind == OpKind::send || op.kind == OpKind::recv) && op.peer != 0 &&
               (op.group == scenarios::Group::pp || op.group == scenarios::Group::cp)) {
      const std::size_t p2p = (g * kByte + static_cast<std::uint8_t>(op.peer)) * 2 + (op.kind == OpKind::send ? 1 : 0);
      if (seen_p2p[p2p]) continue;
      seen_p2p[p2p] = true;
      p2p_ops.insert({static_cast<int>(op.group), op.peer, op.kind == OpKind::send});
    }
  }
  // Communicators with their peers: (group, peer rank) -> whether its communicator spans nodes.
  std::set<std::tuple<int, int, bool>> p2p_comms;  // (group, peer rank, send)
  std::map<std::pair<int, int>, bool> peers;
  std::set<std::pair<int, int>> network_comms;  // (group, peer rank or -1 for the group's): with network peers
  for (const int g : a2a_groups) {
    const auto group = static_cast<scenarios::Group>(g);
    const bool spans = !L.group_within_node(group, rep);
    for (int r : L.group_members(group, rep)) {
      if (r == rep) continue;
      peers[{g, r}] = peers[{g, r}] || spans;
      if (L.node_of(r) != L.node_of(rep)) network_comms.insert({g, -1});
    }
  }
  for (const auto& [g, offset, send] : p2p_ops) {
    const auto group = static_cast<scenarios::Group>(g);
    int peer = rep;
    if (group == scenarios::Group::pp) {
      const int pp = L.group_size(scenarios::Group::pp);
      peer = L.rank_at_stage(rep, ((L.stage_of(rep) + offset) % pp + pp) % pp);
    } else {
      const auto members = L.group_members(scenarios::Group::cp, rep);
      const int n = static_cast<int>(members.size());
      const int idx = L.group_index(scenarios::Group::cp, rep);
      peer = members[static_cast<std::size_t>(((idx + offset) % n + n) % n)];
    }
    if (peer == rep) continue;
    p2p_comms.insert({g, peer, send});
    const bool spans = L.node_of(peer) != L.node_of(rep);  // a two-rank communicator
    peers[{g, peer}] = peers[{g, peer}] || spans;
    if (spans) network_comms.insert({g, peer});
  }
  double peer_bytes = 0.0;
  for (const auto& [key, spans] : peers) {
    const auto group = static_cast<scenarios::Group>(key.first);
    const bool network_peer = L.node_of(key.second) != L.node_of(rep);
    const int comm_ranks = group == scenarios::Group::pp ? 2 : L.group_size(group);
    peer_bytes += nccl_p2p_peer_bytes(m, network_peer, spans, comm_ranks);
  }
  return static_cast<double>(coll_comms.size()) * (m.communicator.value + m.collective.value) +
         static_cast<double>(p2p_comms.size()) * m.communicator.value + peer_bytes +
         static_cast<double>(network_comms.size()) * kNcclNetSharedPoolBytes;
}

// Largest transient buffer of the token dispatcher for one MoE layer.
double dispatcher_bytes(const Scenario& s, double expert_load, const scenarios::Layout& L, int rep_rank) {
  // Without expert parallelism no token leaves its rank: no send and receive buffers, and the
  // permuted tokens are the layer's activations.
  if (!s.model.is_moe() || s.parallel.ep == 1) return 0.0;
  const scenarios::ExecOptions& e = s.exec();
  const double t = s.parallel.tp;
  const double rep = s.parallel.sequence_parallel ? t : 1.0;
  const double tokens = tokens_per_microbatch(s) / rep;
  const double h = s.model.hidden_size;
  const double k = s.model.moe_router_topk;
  switch (e.token_dispatcher) {
    case scenarios::Dispatcher::alltoall:
      return 2.0 * (2.0 * tokens * k * expert_load * h);  // send and receive buffers
    case scenarios::Dispatcher::allgather:
      return 2.0 * tokens * s.parallel.ep * s.parallel.tp * h;  // gathered hidden states
    case scenarios::Dispatcher::flex: {
      const bool spans = !L.group_within_node(scenarios::Group::ep, rep_rank);
      return kDeepEpBufferBytes * (spans ? 2.0 : 1.0);  // NVLink buffer (+ RDMA buffer)
    }
  }
  return 0.0;
}

// The ops that stand for `rc`'s (MemoryOptions::communication_ops): those of that graph's first class
// on rc's pipeline stage; rc's own otherwise.
const std::vector<Op>& communication_ops_of(const scenarios::RankClass& rc, const MemoryOptions& opt) {
  if (opt.communication_ops != nullptr) {
    for (const scenarios::RankClass& other : opt.communication_ops->classes) {
      if (other.pp_stage == rc.pp_stage) return other.ops;
    }
  }
  return rc.ops;
}

int captured_scopes(const scenarios::ExecOptions& e) {
  int n = 0;
  for (const char* scope : scenarios::graph_scopes::kPerLayer) n += e.graph_scope(scope) ? 1 : 0;
  return n;
}

}  // namespace

namespace {
// operand_bytes with the scenario's KV cache per layer (0 in training) computed by the caller.
double operand_bytes_of(const Op& op, double kv_per_layer) {
  if (op.kind == OpKind::host || scenarios::works_on_parameter_state(op)) return 0.0;
  // A decode attention's keys and values are the KV cache (activations), not operand buffers.
  const double kv_read = scenarios::reads_kv_cache(op, kv_per_layer) ? scenarios::attention_kv_bytes(op) : 0.0;
  return std::max(0.0, op.bytes - kv_read);
}
double kv_per_layer_of(const Scenario& s) { return s.infer ? scenarios::kv_cache_bytes_per_layer(s) : 0.0; }
}  // namespace

double operand_bytes(const Scenario& s, const Op& op) { return operand_bytes_of(op, kv_per_layer_of(s)); }

std::vector<Op> runner_ops(const Scenario& s, const std::vector<Op>& ops) {
  // Per stream: the op of the most operand bytes, and its first fused attention.
  struct Kept {
    const Op* largest = nullptr;
    double bytes = 0.0;
    const Op* attention = nullptr;
  };
  const double kv_per_layer = kv_per_layer_of(s);
  // By stream index (an Op's stream is a byte); a stream without a kept op has no largest.
  std::array<Kept, std::size_t{std::numeric_limits<decltype(Op::stream)>::max()} + 1> kept{};
  for (const Op& op : ops) {
    if (op.kind == OpKind::host) continue;
    Kept& k = kept[op.stream];
    const double bytes = operand_bytes_of(op, kv_per_layer);
    if (k.largest == nullptr || bytes > k.bytes) {
      k.largest = &op;
      k.bytes = bytes;
    }
    if (k.attention == nullptr && op.kind == OpKind::attention &&
        scenarios::attention_kernel(op) != scenarios::AttentionKernel::unfused) {
      k.attention = &op;
    }
  }
  std::vector<Op> out;
  for (const Kept& k : kept) {
    if (k.largest == nullptr) continue;
    out.push_back(*k.largest);
    if (k.attention != nullptr && k.attention != k.largest) out.push_back(*k.attention);
  }
  return out;
}

MemoryReport memory_model(const Scenario& s, const scenarios::StepGraph& graph, const MemoryOptions& opt) {
  MemoryReport report;
  report.gpu_memory = s.cluster.gpu_memory;
  const scenarios::Layout& L = graph.layout;
  const int pp = s.parallel.pp;
  const int vpp = std::max(1, s.parallel.vpp);
  for (const scenarios::RankClass& rc : graph.classes) {
    ClassMemory cm;
    cm.id = rc.id;
    cm.label = rc.label;
    cm.ranks = static_cast<int>(rc.ranks.size());
    const bool first = rc.pp_stage == 0;
    const bool last = rc.pp_stage == pp - 1;
    cm.params = scenarios::rank_parameters(s, rc.layers, first, last);
    const int rep_rank = rc.representative();
    MemoryBreakdown& b = cm.breakdown;
    double act_per_mb = 0.0;  // all layers of the stage, one micro-batch
    double largest_layer = 0.0;
    for (int l : rc.layers) {
      const double a = scenarios::layer_activation_bytes(s, l, rc.expert_load, opt.activations());
      act_per_mb += a;
      largest_layer = std::max(largest_layer, a);
    }
    const double resid = residual_bytes(s);
    const double V = static_cast<double>(s.model.padded_vocab_size(s.parallel.tp));
    if (s.train) {
      const scenarios::TrainSpec& tr = *s.train;
      // Weights, gradients, optimizer (docs: "Weights, gradients, optimizer state", "FSDP").
      const scenarios::ParameterStateBytes state = scenarios::training_parameter_state(s, L, rc.layers, first, last);
      b.weights = Bytes(state.weights);
      b.gradients = Bytes(state.gradients);
      b.optimizer = Bytes(state.optimizer);
      // Activations (docs: "Micro-batches in flight", "Full recomputation").
      const int n_layers = static_cast<int>(rc.layers.size());
      double stored_per_mb = act_per_mb;
      double transient = 0.0;
      if (tr.recompute_granularity == scenarios::RecomputeGranularity::full && n_layers > 0) {
        const int N = std::max(1, tr.recompute_num_layers);
        if (tr.recompute_method == scenarios::RecomputeMethod::uniform) {
          const int groups = (n_layers + N - 1) / N;
          stored_per_mb = groups * resid;
          transient = std::min(N, n_layers) * largest_layer;
        } else {
          const int per_chunk = std::max(1, n_layers / vpp);
          const int recomputed = std::min(N, per_chunk) * vpp;
          stored_per_mb = recomputed * resid + (act_per_mb * (n_layers - recomputed)) / n_layers;
          transient = largest_layer;
        }
      }
      // Embedding output on the first stage; final norm, output input and fp32 logits on the last.
      double edge_per_mb = 0.0;
      if (first) edge_per_mb += scenarios::embedding_activation_bytes(s, opt.activations());
      if (last) edge_per_mb += scenarios::head_activation_bytes(s);
      const int m = tr.num_microbatches;
      const int inflight = inflight_chunk_microbatches(pp, vpp, rc.pp_stage, m, tr.overlap_moe_expert_parallel_comm);
      cm.inflight = inflight;
      const double per_chunk_mb = stored_per_mb / vpp;
      // The embedding and output tensors belong to the first and last model chunk only: about one in
      // vpp of the chunk-micro-batches in flight.
      const int edge_inflight = (inflight + vpp - 1) / vpp;
      b.activations = Bytes(inflight * per_chunk_mb + edge_inflight * edge_per_mb + transient);
      cm.activation_per_microbatch = stored_per_mb + edge_per_mb;
      // CUDA-graph pools (docs: "CUDA-graph pools").
      const scenarios::ExecOptions& e = s.exec();
      if (e.graph_scope(scenarios::graph_scopes::kFullIteration)) {
        b.graph_pools = Bytes(2.0 * 2.0 * resid);
      } else {
        const int scopes = captured_scopes(e);
        b.graph_pools = Bytes(static_cast<double>(scopes) * n_layers * std::max(1, m) * 2.0 * (2.0 * resid));
      }
    } else {
      const scenarios::InferSpec& inf = *s.infer;
      b.weights = Bytes(scenarios::inference_weight_bytes(s, rc.layers, first, last));
      // KV cache (docs: "Inference").
      const double kv = static_cast<double>(rc.layers.size()) * scenarios::kv_cache_bytes_per_layer(s);
      cm.inflight = 1;
      cm.activation_per_microbatch = largest_layer;
      // The KV cache and the last stage's fp32 logits; a layer's transient tensors are the operand
      // buffers of its largest op (buffers, below), not counted twice.
      b.activations = Bytes(kv + (last ? 4.0 * inf.batch_size * V / s.parallel.tp : 0.0));
      const int scopes = captured_scopes(inf.exec);
      b.graph_pools = Bytes(static_cast<double>(scopes) * rc.layers.size() * 2.0 * (2.0 * resid));
    }
    const double nccl =
        opt.nccl ? nccl_bytes_measured(L, rep_rank, communication_ops_of(rc, opt), *opt.nccl) : nccl_bytes(s, L);
    b.buffers = Bytes(runner_bytes(s, rc, opt) + nccl + dispatcher_bytes(s, rc.expert_load, L, rep_rank));
    report.classes.push_back(std::move(cm));
  }
  return report;
}

}  // namespace threewalls::sim
