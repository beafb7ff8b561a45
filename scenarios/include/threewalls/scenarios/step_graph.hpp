#pragma once
// The StepGraph: the ops one step performs on each rank class, with streams, dependencies, FLOPs,
// bytes and, for communication, the collective, group and size. Both executors walk it; neither
// invents ops of its own. Format of the records they write: docs/formats/run_dir.md.
//
// Contract for executors
//  * `RankClass::ops` is in host issue order: a rank's host thread launches op i before op i+1.
//  * Ops on the same stream of a rank run in list order (FIFO), as on a CUDA stream.
//  * `deps` name earlier ops of the same rank class that must finish before the op starts
//    (cross-stream edges; same-stream order is implied and not repeated).
//  * A collective op synchronises all members of its group (Layout::group_members); every member
//    issues its matching op (same phase, layer, microbatch) in the same relative order.
//  * A send op is matched with the recv op of the peer rank that has the same `tag` and the opposite
//    direction (`peer` = +1 means the next pipeline stage, -1 the previous one, both for send and recv).
//    Pipeline sends and receives have a stream per direction of travel and role (`pp_fwd_send`,
//    `pp_fwd_recv`, `pp_bwd_send`, `pp_bwd_recv`), each talking to one peer, so the strict FIFO order
//    per stream holds for them too and cannot deadlock; a real executor gives each such stream pair
//    (a rank's `pp_fwd_send` and its next stage's `pp_fwd_recv`) its own communicator.
//  * Host ops (`OpKind::host`) occupy the rank's host thread; `stream_sync`, `gpu_read` and `barrier`
//    wait for their deps to finish on the device before the host goes on.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "threewalls/core/vocabulary.hpp"
#include "threewalls/scenarios/layout.hpp"
#include "threewalls/scenarios/scenario.hpp"

namespace threewalls::scenarios {

enum class OpKind : std::uint8_t {
  gemm,           // shape: {m, n, k, batch}; flops = 2 m n k batch; C[m,n] = A[m,k] B[k,n]
  grouped_gemm,   // shape: {total rows m, n, k, groups, max rows in a group, varying}; one GEMM per local
                  // expert: varying = 0: group g computes (r_g x k)(k x n); varying = 1 (wgrad): group g
                  // computes (n x r_g)(r_g x k) = dW_g, i.e. the group's rows are the reduction dimension
  attention,      // shape: {batch, seq_q, seq_kv, heads, head_dim_qk, head_dim_v, kv_heads (0: heads), window (0: none;
                  // > 0 with kCausal only: the keys each query sees at most, core/attention_mask.hpp)}; flag kCausal;
                  // bwd when kBackward;
                  // `sub` = AttentionImpl (scenario.hpp)
  elementwise,    // shape: {output elements}; bytes = bytes read + written; `sub` = ElementwiseKind
  norm,           // shape: {rows, hidden}; bytes read + written; `sub` = NormKind
  softmax_topk,   // router scores -> top-k: shape {tokens, experts, topk}
  permute,        // gather token rows into expert order: shape {rows out, hidden, tokens the rows come from
                  // (0: the rows themselves, a pure reordering)}
  unpermute,      // scatter-add rows back: shape {rows in, hidden, tokens they are summed into (0: the rows
                  // themselves)}; `sub` = RowWeights (a backward keeps its forward's `sub`, see RowWeights)
  embedding,      // row gather: shape {tokens, hidden, rows of this rank's table}
  cross_entropy,  // vocab-parallel loss: shape {tokens, vocab shard}
  optimizer,      // Adam step: shape {parameters}; bytes = parameter, gradient and state traffic
  copy,           // shape {bytes}; `sub` = CopyKind
  collective,     // `sub` = Collective; bytes = nccl-tests "size" (see below); group, group_size
  send,           // pipeline / context-parallel point-to-point; bytes; peer; tag
  recv,
  host,  // host-only work; `sub` = HostKind; shape {duration_ns hint or 0}
};

// Walls, element types, copy kinds and collectives are the core vocabulary (core/vocabulary.hpp).
using threewalls::Collective;
using threewalls::CopyKind;
using threewalls::DType;
using threewalls::to_string;
using threewalls::Wall;
// For collectives `bytes` follows nccl-tests: all_reduce, broadcast: the buffer size; all_gather: the
// gathered output size; reduce_scatter: the input size; all_to_all: the bytes this rank sends in total
// (including its own share); a collective op is never Collective::send_recv (send and recv are ops). MoE all-to-alls
// carry shape {balanced bytes B, routed}: routed = 0: every peer pair exchanges B / n; routed = 1 (dispatch): rank i
// sends B * share(ep_rank(j)) to peer j; routed = 2 (combine): rank i sends B * share(ep_rank(i)) to every peer j, with
// share() from RoutingModel (layout.hpp). `bytes` is then this rank's total send.
enum class HostKind : std::uint8_t { stream_sync, gpu_read, framework, barrier, graph_launch };
// What an element-wise op computes. swiglu: y[r, j] = silu(x[r, j]) x[r, f + j] (reads 2 f, writes f
// per row); add: residual/bias-dropout-add (reads 2, writes 1); copy: kv-cache append; reduce: a
// read-mostly reduction (gradient norm); the _bwd kinds are the matching backward kernels. quantize:
// an fp8 cast of a bf16 tensor, shape {elements, rows, columns, columnwise}: reads the bf16 rows x
// columns, writes the fp8 copy and, when columnwise = 1, a transposed fp8 copy for the backward GEMMs
// (Transformer Engine's cast-transpose); amax: the absolute maximum of a bf16 tensor (current
// scaling's pass before the cast), shape {elements}. docs/stepgraph.md, "FP8 quantisation".
enum class ElementwiseKind : std::uint8_t { add, copy, swiglu, swiglu_bwd, gelu, gelu_bwd, reduce, quantize, amax };
enum class NormKind : std::uint8_t { rmsnorm, layernorm };
// Whether an unpermute scales its rows by their router probabilities as it sums them. The weights are
// applied once per routed row: `weighted` (every unpermute but one kind) where the op is where they
// are applied; `unweighted` for Hugging Face's loop's per-expert scatter when a moe_unpermute after
// the experts applies them (the loop over the rows an EP rank received: ep > 1). The backward op of
// an unpermute is an unpermute with kBackward (its gradient: the row gather) and the same `sub`; a
// permute has `sub` 0.
enum class RowWeights : std::uint8_t { weighted, unweighted };
enum class StreamKind : std::uint8_t { compute, communication, copy, host };

// Op flags.
inline constexpr std::uint8_t kBackward = 1U << 0;    // part of the backward pass (dgrad, wgrad, bwd kernels)
inline constexpr std::uint8_t kRecompute = 1U << 1;   // re-forward for activation recomputation (not model FLOPs)
inline constexpr std::uint8_t kCausal = 1U << 2;      // attention: causal mask
inline constexpr std::uint8_t kWgrad = 1U << 3;       // weight-gradient GEMM
inline constexpr std::uint8_t kDataLoad = 1U << 4;    // part of the coarse "host_to_device" view
inline constexpr std::uint8_t kMetrics = 1U << 5;     // part of the coarse "training_metrics" view
inline constexpr std::uint8_t kParameterState = 1U << 6;  // reads or writes the parameter state only
                                                          // (scenarios::works_on_parameter_state)
inline constexpr std::uint8_t kNewShape = 1U << 7;        // attention: the step's first call at a shape the
                                                          // process has not run (an eager framework builds
                                                          // its plan first: docs/simulator.md)

// An op's sizes, their meaning by kind (OpKind, above); trailing sizes a kind does not use are 0.
using OpShape = std::array<std::int64_t, 8>;

struct Op {
  OpShape shape{};                      // meaning by kind, above
  double flops = 0.0;                   // FLOPs executed on this rank
  double bytes = 0.0;                   // memory traffic, or payload for copies and communication
  std::uint32_t deps_begin = 0;         // [deps_begin, deps_end) in RankClass::deps
  std::uint32_t deps_end = 0;
  std::int32_t tag = -1;                // send/recv matching tag
  std::int32_t tokens = -1;             // tokens handled (MoE ops), -1 = not applicable
  std::int32_t layer = -1;              // global layer index, -1 = none (embedding, loss, optimizer)
  std::int32_t microbatch = -1;         // -1 = not per micro-batch
  std::int32_t expert = -1;             // local expert index for per-expert ops
  std::int32_t chunk = -1;              // model chunk (virtual stage) for interleaved schedules
  std::int32_t group_size = 1;          // members of `group` (collectives)
  std::uint16_t phase = 0;              // index into StepGraph::phases
  std::uint8_t stream = 0;              // index into StepGraph::streams
  OpKind kind = OpKind::gemm;
  Wall wall = Wall::compute;
  std::uint8_t sub = 0;  // by kind: Collective, CopyKind, HostKind, ElementwiseKind, NormKind,
                         // AttentionImpl, RowWeights
  Group group = Group::none;
  std::int8_t peer = 0;                 // send/recv: +1 next, -1 previous (stage or CP ring neighbour)
  DType dtype = DType::bf16;
  std::uint8_t graph = 0;               // 0 = launched eagerly; g > 0: captured in StepGraph::graphs[g-1]
  std::uint8_t flags = 0;

  [[nodiscard]] Collective collective() const { return static_cast<Collective>(sub); }
  [[nodiscard]] CopyKind copy_kind() const { return static_cast<CopyKind>(sub); }
  [[nodiscard]] HostKind host_kind() const { return static_cast<HostKind>(sub); }
  [[nodiscard]] ElementwiseKind elementwise_kind() const { return static_cast<ElementwiseKind>(sub); }
  [[nodiscard]] NormKind norm_kind() const { return static_cast<NormKind>(sub); }
  [[nodiscard]] RowWeights row_weights() const { return static_cast<RowWeights>(sub); }
  [[nodiscard]] AttentionImpl attention_impl() const { return static_cast<AttentionImpl>(sub); }
  [[nodiscard]] bool is_comm() const { return kind == OpKind::collective || kind == OpKind::send || kind == OpKind::recv; }
};
// A step graph holds millions of ops: the fields are ordered so that an Op packs into 128 bytes.
static_assert(sizeof(Op) <= 128, "Op grew: check the field order and widths");

// The kernels an attention op runs on (threewalls run) and is costed as (the simulator): `decode`,
// the split-KV kernel, for a fused forward with one query per sequence (seq_q = 1); `fused`, a
// flash-style fused kernel; `unfused`, batched GEMMs with the scores in memory.
enum class AttentionKernel : std::uint8_t { fused, unfused, decode };
// Key/value heads of an attention op (GQA: fewer than its query heads; MHA and MLA: as many).
[[nodiscard]] inline std::int64_t attention_kv_heads(const Op& op) {
  return op.shape[6] > 0 ? op.shape[6] : op.shape[3];
}
[[nodiscard]] inline AttentionKernel attention_kernel(const Op& op) {
  if (op.attention_impl() == AttentionImpl::unfused) return AttentionKernel::unfused;
  return op.shape[1] == 1 && (op.flags & kBackward) == 0 ? AttentionKernel::decode : AttentionKernel::fused;
}

struct StreamInfo {
  std::string name;  // "compute", "dp_comm", "pp_fwd", "pp_bwd", "copy", "expert_1", ...
  StreamKind kind = StreamKind::compute;
};

// One CUDA-graph capture: a contiguous run of ops (by index in issue order) of one rank class
// replayed with one launch. Listed per class in RankClass::graph_runs.
struct GraphRun {
  std::uint32_t first_op = 0;
  std::uint32_t end_op = 0;  // exclusive
  std::uint8_t graph = 0;    // index + 1 into StepGraph::graphs
};

// Ranks that do identical work in a step.
struct RankClass {
  int id = 0;
  int pp_stage = 0;
  std::string label;          // "stage 0", "stage 3 / hot EP rank", "stage 1 / slow rank 9"
  std::vector<int> ranks;     // members, ascending
  double expert_load = 1.0;   // tokens received for the local experts / the balanced share
  std::vector<Op> ops;
  std::vector<std::uint32_t> deps;
  std::vector<GraphRun> graph_runs;
  // Parameters held by a rank of this class (for the memory model and optimizer): dense and expert.
  double dense_params = 0.0;
  double expert_params = 0.0;
  std::vector<int> layers;    // global layer indices on this stage, in chunk order
  // Inference with MoE (per step): local experts activated, summed over the MoE layers, and how many
  // of them were in the GPU expert cache when their layer ran (all of them without offloading). The
  // cache hit rate of summary.json is experts_cache_hits / experts_activated.
  std::int64_t experts_activated = 0;
  std::int64_t experts_cache_hits = 0;

  [[nodiscard]] int representative() const { return ranks.empty() ? -1 : ranks.front(); }
  [[nodiscard]] const std::uint32_t* deps_of(const Op& op) const { return deps.data() + op.deps_begin; }
  [[nodiscard]] std::size_t num_deps(const Op& op) const { return op.deps_end - op.deps_begin; }
};

struct StepGraph {
  int step = 0;                     // the step this graph is for (inference graphs vary by step)
  bool varies_per_step = false;     // inference: prefill vs decode; executors re-expand per step
  std::string step_kind;            // "train", "prefill", "decode"
  Layout layout;
  std::vector<std::string> phases;  // phase names, indexed by Op::phase
  std::vector<StreamInfo> streams;
  std::vector<std::string> graphs;  // captured CUDA-graph scopes ("attn", "moe_router", ...)
  std::vector<RankClass> classes;
  std::vector<int> class_of_rank;   // world-sized
  // Megatron-LM's num_floating_point_operations for one step (all ranks, model FLOPs, no recompute).
  double model_flops = 0.0;
  // Tokens processed per step (global batch x sequence, or the decode batch).
  double tokens = 0.0;

  [[nodiscard]] const std::string& phase_name(const Op& op) const { return phases[op.phase]; }
  [[nodiscard]] const std::string& stream_name(const Op& op) const { return streams[op.stream].name; }
  [[nodiscard]] std::size_t total_ops() const;
  [[nodiscard]] const RankClass& class_of(int rank) const { return classes[static_cast<std::size_t>(class_of_rank[static_cast<std::size_t>(rank)])]; }
};

// Expands one step of `s`. For training every step is the same (step = 0 will do); inference steps
// alternate prefill and decode (see docs/stepgraph.md). Throws InputError for scenarios that the
// expansion does not support.
StepGraph expand(const Scenario& s, int step = 0);

// Megatron-LM's FLOPs-per-iteration formula (training.py, num_floating_point_operations) for the
// scenario's model and global batch. Model FLOPs only: no recomputation.
double megatron_flops_per_iteration(const Scenario& s);

// Fraction of a GPU's SMs an op's kernel occupies (the simulator's stream concurrency, and the
// calibration's multi-stream benchmarks that fit it): tiles of 128 x 128 for GEMMs (per batch entry
// for a batched GEMM), one block per head and 128 rows for attention, one block per 64 KiB for
// memory-bound kernels; between 1 / sm_count and 1 (1 when sm_count <= 0).
double sm_fraction(const Op& op, int sm_count);

const char* to_string(OpKind k);
const char* to_string(HostKind h);
const char* to_string(ElementwiseKind e);
const char* to_string(StreamKind s);

}  // namespace threewalls::scenarios
