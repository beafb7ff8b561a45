// Expansion of a scenario into the StepGraph of one step (training). docs/stepgraph.md describes the
// ops, their phase names, shapes, FLOPs and bytes; this file is the reference.
//
// A layer is first described as a small *forward program* (a DAG of op specs with data edges); the
// forward, recompute and backward ops of every micro-batch are instantiated from it, so forward and
// backward always mirror each other. Ops are appended to a rank class in host issue order, following
// Megatron-Core's 1F1B and interleaved pipeline schedules.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <unordered_map>

#include "expand_internal.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/parameters.hpp"
#include "threewalls/scenarios/routing.hpp"
#include "threewalls/scenarios/stages.hpp"
#include "threewalls/scenarios/step_graph.hpp"
#include "threewalls/scenarios/stepper.hpp"

namespace threewalls::scenarios {
namespace detail {

// ---------------------------------------------------------------------------------------------
// GraphBuilder
// ---------------------------------------------------------------------------------------------

std::uint16_t GraphTables::phase(std::string_view name) {
  auto it = phase_ids_.find(std::string(name));
  if (it != phase_ids_.end()) return it->second;
  if (graph_.phases.size() >= std::numeric_limits<std::uint16_t>::max()) {
    throw Error("StepGraph: too many distinct phase names");
  }
  auto id = static_cast<std::uint16_t>(graph_.phases.size());
  graph_.phases.emplace_back(name);
  phase_ids_.emplace(std::string(name), id);
  return id;
}

std::uint8_t GraphTables::stream(std::string_view name, StreamKind kind) {
  for (std::size_t i = 0; i < graph_.streams.size(); ++i) {
    if (graph_.streams[i].name == name) return static_cast<std::uint8_t>(i);
  }
  if (graph_.streams.size() >= 255) throw Error("StepGraph: too many streams");
  graph_.streams.push_back({std::string(name), kind});
  return static_cast<std::uint8_t>(graph_.streams.size() - 1);
}

std::uint8_t GraphTables::graph_scope(std::string_view name) {
  for (std::size_t i = 0; i < graph_.graphs.size(); ++i) {
    if (graph_.graphs[i] == name) return static_cast<std::uint8_t>(i + 1);
  }
  graph_.graphs.emplace_back(name);
  return static_cast<std::uint8_t>(graph_.graphs.size());
}

std::uint32_t ClassBuilder::emit(Op op, std::initializer_list<std::uint32_t> deps) {
  return emit(op, deps.begin(), deps.end());
}

std::uint32_t ClassBuilder::emit(Op op, const std::uint32_t* deps_begin, const std::uint32_t* deps_end) {
  op.deps_begin = static_cast<std::uint32_t>(rc_.deps.size());
  for (const auto* d = deps_begin; d != deps_end; ++d) {
    if (*d == kNoOp) continue;
    // Same-stream order is implied (FIFO); keep only cross-stream edges.
    if (rc_.ops[*d].stream == op.stream) continue;
    if (std::find(rc_.deps.begin() + op.deps_begin, rc_.deps.end(), *d) != rc_.deps.end()) continue;
    rc_.deps.push_back(*d);
  }
  op.deps_end = static_cast<std::uint32_t>(rc_.deps.size());
  rc_.ops.push_back(op);
  return static_cast<std::uint32_t>(rc_.ops.size() - 1);
}

void ClassBuilder::add_dep(std::uint32_t op_index, std::uint32_t dep) {
  if (dep == kNoOp) return;
  Op& op = rc_.ops[op_index];
  if (rc_.ops[dep].stream == op.stream) return;
  for (auto i = op.deps_begin; i < op.deps_end; ++i) {
    if (rc_.deps[i] == dep) return;
  }
  if (op.deps_end != rc_.deps.size()) {
    std::vector<std::uint32_t> copy(rc_.deps.begin() + op.deps_begin, rc_.deps.begin() + op.deps_end);
    op.deps_begin = static_cast<std::uint32_t>(rc_.deps.size());
    rc_.deps.insert(rc_.deps.end(), copy.begin(), copy.end());
  }
  rc_.deps.push_back(dep);
  op.deps_end = static_cast<std::uint32_t>(rc_.deps.size());
}

}  // namespace detail

namespace {

using detail::ClassBuilder;
using detail::GraphTables;
using detail::kNoOp;

constexpr double kBf16Bytes = 2.0;
constexpr double kFp32Bytes = 4.0;

// What part of the model an op belongs to: drives recomputation and CUDA-graph scopes.
enum class Module : std::uint8_t {
  attn_norm,
  attn_proj_in,  // QKV (or MLA down projections)
  mla_up,        // MLA up projections
  attn_core,
  attn_out,      // output projection, TP collectives, residual
  mlp_norm,
  mlp,           // dense MLP
  router,
  moe_pre,       // permute before dispatch
  moe_comm,      // dispatch/combine
  moe_expert,    // expert GEMMs
  moe_act,       // expert activation
  moe_post,      // unpermute after combine
  shared,        // shared experts
  host,          // host ops
  embedding,
  head,
};

enum class Role : std::uint8_t { compute, tp_comm, cp_comm, shared, expert };

// How an op is mirrored in the backward pass.
enum class Bwd : std::uint8_t { gemm, grouped, attention, same_kind, swap_permute, collective, none };

struct Spec {
  OpKind kind = OpKind::gemm;
  std::string name;  // phase base name; suffixes _fwd, _dgrad, _wgrad, _bwd, _recompute are added
  std::array<std::int64_t, 6> shape{};
  double flops = 0;
  double bytes = 0;
  double bwd_bytes = 0;  // bytes of the backward op (same_kind / swap_permute)
  Wall wall = Wall::compute;
  std::uint8_t sub = 0;
  Group group = Group::none;
  DType dtype = DType::bf16;
  Role role = Role::compute;
  int expert = -1;
  int stream_slot = 0;  // expert streams: 0 = compute, k = expert_k
  std::vector<int> after;  // producers in the program; -1 = the program's input
  Module module = Module::attn_norm;
  Bwd bwd = Bwd::same_kind;
  std::int32_t tokens = -1;
  std::uint8_t flags = 0;
};

// Derived quantities shared by every class of a scenario (for one step).
struct Ctx {
  const Scenario& s;
  const Layout layout;
  int tp, cp, pp, vpp, dp, ep, etp, edp;
  bool sp;
  int mbs;               // sequences per micro-batch (training) or decode batch (inference)
  int seq;               // query tokens per sequence in this step
  std::int64_t seq_kv;   // keys per sequence (= seq in training and prefill)
  int num_mb;
  bool training;
  bool causal;
  std::int64_t h;
  std::int64_t T;     // tokens of one micro-batch on a rank after the CP split
  std::int64_t Tsp;   // rows in sequence-parallel regions
  std::int64_t vocab;  // padded
  int E, E_loc, topk;
  std::int64_t ffn, ffn_e, ffn_shared;
  bool swiglu;
  double gemm_elt;  // bytes per GEMM input element
  DType gemm_dtype;
  const ExecOptions& exec;
  const TrainSpec* train;  // null for inference
  bool tp_comm_overlap;
  bool shared_overlap;
  const StageSplit stages;

  // Training step.
  explicit Ctx(const Scenario& sc) : Ctx(sc, sc.train->micro_batch_size, sc.train->seq_length, sc.train->seq_length, true) {
    num_mb = sc.train->num_microbatches;
  }

  Ctx(const Scenario& sc, int batch, int seq_q, std::int64_t kv, bool is_training)
      : s(sc), layout(sc), tp(sc.parallel.tp), cp(sc.parallel.cp), pp(sc.parallel.pp), vpp(sc.parallel.vpp),
        dp(sc.parallel.dp), ep(sc.parallel.ep), etp(sc.parallel.etp), edp(sc.parallel.edp),
        sp(sc.parallel.sequence_parallel), mbs(batch), seq(seq_q), seq_kv(kv), num_mb(1), training(is_training),
        causal(seq_q == kv), h(sc.model.hidden_size), T(static_cast<std::int64_t>(batch) * seq_q / sc.parallel.cp),
        Tsp(0), vocab(sc.model.padded_vocab_size(sc.parallel.tp)), E(sc.model.num_experts),
        E_loc(sc.model.is_moe() ? sc.model.num_experts / sc.parallel.ep : 0), topk(sc.model.moe_router_topk),
        ffn(sc.model.ffn_hidden_size), ffn_e(sc.model.is_moe() ? sc.model.moe_ffn_hidden_size / sc.parallel.etp : 0),
        ffn_shared(sc.model.moe_shared_expert_intermediate_size), swiglu(sc.model.swiglu),
        gemm_elt(sc.exec().precision == Precision::fp8 ? 1.0 : 2.0),
        gemm_dtype(sc.exec().precision == Precision::fp8 ? DType::fp8 : DType::bf16), exec(sc.exec()),
        train(sc.train ? &*sc.train : nullptr), tp_comm_overlap(sc.train && sc.train->tp_comm_overlap),
        shared_overlap(sc.train && sc.train->moe_shared_expert_overlap), stages(sc) {
    Tsp = sp ? T / tp : T;
  }
};

// Per-class information (routing load, stage).
struct ClassInfo {
  int stage = 0;
  double load = 1.0;  // expert tokens received relative to the balanced share
  // Rows after dispatch (and ETP all-gather) on this rank: T_loc * topk * load * etp.
  std::int64_t expert_rows = 0;
};

double gemm_bytes(std::int64_t m, std::int64_t n, std::int64_t k, double elt) {
  return (static_cast<double>(m) * k + static_cast<double>(k) * n) * elt + static_cast<double>(m) * n * kBf16Bytes;
}

Spec gemm(const Ctx& c, std::string name, std::int64_t m, std::int64_t n, std::int64_t k, Module mod,
          std::vector<int> after = {}) {
  Spec sp;
  sp.kind = OpKind::gemm;
  sp.name = std::move(name);
  sp.shape = {m, n, k, 1, 0, 0};
  sp.flops = 2.0 * m * n * k;
  sp.bytes = gemm_bytes(m, n, k, c.gemm_elt);
  sp.wall = Wall::compute;
  sp.dtype = c.gemm_dtype;
  sp.module = mod;
  sp.bwd = Bwd::gemm;
  sp.after = std::move(after);
  return sp;
}

Spec memory_op(OpKind kind, std::string name, std::array<std::int64_t, 6> shape, double bytes, double bwd_bytes,
               Module mod, std::vector<int> after = {}) {
  Spec sp;
  sp.kind = kind;
  sp.name = std::move(name);
  sp.shape = shape;
  sp.bytes = bytes;
  sp.bwd_bytes = bwd_bytes;
  sp.wall = Wall::memory;
  sp.module = mod;
  sp.bwd = (kind == OpKind::permute || kind == OpKind::unpermute) ? Bwd::swap_permute : Bwd::same_kind;
  sp.after = std::move(after);
  return sp;
}

Spec norm_op(std::string name, std::int64_t rows, std::int64_t width, Module mod, std::vector<int> after = {}) {
  double fwd = 2.0 * rows * width * kBf16Bytes;  // read x, write y
  double bwd = 3.0 * rows * width * kBf16Bytes;  // read x and dy, write dx
  return memory_op(OpKind::norm, std::move(name), {rows, width, 0, 0, 0, 0}, fwd, bwd, mod, std::move(after));
}

Spec collective(std::string name, Collective kind, Group g, double bytes, Role role, Module mod,
                std::vector<int> after = {}) {
  Spec sp;
  sp.kind = OpKind::collective;
  sp.name = std::move(name);
  sp.sub = static_cast<std::uint8_t>(kind);
  sp.group = g;
  sp.bytes = bytes;
  sp.shape = {static_cast<std::int64_t>(bytes), 0, 0, 0, 0, 0};
  sp.wall = Wall::communication;
  sp.role = role;
  sp.module = mod;
  sp.bwd = Bwd::collective;
  sp.after = std::move(after);
  return sp;
}

std::uint8_t activation_kind(const Ctx& c) {
  return static_cast<std::uint8_t>(c.swiglu ? ElementwiseKind::swiglu : ElementwiseKind::gelu);
}

// A program: the forward ops of one layer (or of the embedding / output head), as a DAG.
struct Program {
  std::vector<Spec> specs;
  int add(Spec s) {
    if (s.after.empty()) s.after.push_back(static_cast<int>(specs.size()) - 1);  // previous op (or input)
    specs.push_back(std::move(s));
    return static_cast<int>(specs.size()) - 1;
  }
};

// ---- TP helpers: gather before a column-parallel region, reduce after a row-parallel one ----
Role tp_role(const Ctx& c) { return c.tp_comm_overlap ? Role::tp_comm : Role::compute; }

void add_tp_gather(const Ctx& c, Program& p, const std::string& name, std::int64_t width, Module mod) {
  if (c.tp > 1 && c.sp) {
    p.add(collective(name + "_sp_allgather", Collective::all_gather, Group::tp,
                     static_cast<double>(c.T) * width * kBf16Bytes, tp_role(c), mod));
  }
}

void add_tp_reduce(const Ctx& c, Program& p, const std::string& name, Module mod) {
  if (c.tp <= 1) return;
  if (c.sp) {
    p.add(collective(name + "_sp_reducescatter", Collective::reduce_scatter, Group::tp,
                     static_cast<double>(c.T) * c.h * kBf16Bytes, tp_role(c), mod));
  } else {
    p.add(collective(name + "_tp_allreduce", Collective::all_reduce, Group::tp, static_cast<double>(c.T) * c.h * kBf16Bytes,
                     tp_role(c), mod));
  }
}

Spec attention_spec(const Ctx& c, std::string name, std::int64_t seq_q, std::int64_t seq_kv, bool causal,
                    std::int64_t heads, std::int64_t kv_heads, std::int64_t dqk, std::int64_t dv) {
  Spec sp;
  sp.kind = OpKind::attention;
  sp.sub = static_cast<std::uint8_t>(c.s.model.attention_impl);
  sp.name = std::move(name);
  sp.shape = {c.mbs, seq_q, seq_kv, heads, dqk, dv};
  // Causal: half of the score matrix (Megatron's accounting); QK^T and PV.
  double pairs = static_cast<double>(seq_q) * seq_kv * (causal ? 0.5 : 1.0);
  sp.flops = 2.0 * c.mbs * heads * pairs * static_cast<double>(dqk + dv);
  sp.bytes = kBf16Bytes * c.mbs *
             (static_cast<double>(seq_q) * heads * (dqk + dv) + static_cast<double>(seq_kv) * kv_heads * (dqk + dv));
  sp.bwd_bytes = 2.5 * sp.bytes;
  sp.wall = Wall::compute;
  sp.module = Module::attn_core;
  sp.bwd = Bwd::attention;
  sp.flags = causal ? kCausal : 0;
  return sp;
}

// ---- attention block ----
void attention_block(const Ctx& c, Program& p) {
  const auto& m = c.s.model;
  const std::int64_t heads = m.num_attention_heads / c.tp;
  const int input = -1;
  p.add(norm_op("attn_norm", c.Tsp, c.h, Module::attn_norm, {input}));
  std::int64_t dqk = 0;
  std::int64_t dv = 0;
  std::int64_t kv_heads = 0;
  if (m.attention == AttentionKind::mla) {
    dqk = m.qk_head_dim + m.qk_pos_emb_head_dim;
    dv = m.v_head_dim;
    kv_heads = heads;
    const std::int64_t kv_down = m.kv_lora_rank + m.qk_pos_emb_head_dim;
    if (m.q_lora_rank > 0) {
      // Down projections run on the sequence-parallel rows; the compressed latents are gathered.
      int norm_out = static_cast<int>(p.specs.size()) - 1;
      p.add(gemm(c, "attn_q_down", c.Tsp, m.q_lora_rank, c.h, Module::attn_proj_in, {norm_out}));
      p.add(gemm(c, "attn_kv_down", c.Tsp, kv_down, c.h, Module::attn_proj_in, {norm_out}));
      int kvd = static_cast<int>(p.specs.size()) - 1;
      int qd = kvd - 1;
      p.add(norm_op("attn_latent_norm", c.Tsp, m.q_lora_rank + m.kv_lora_rank, Module::attn_proj_in, {qd, kvd}));
      add_tp_gather(c, p, "attn", m.q_lora_rank + kv_down, Module::attn_proj_in);
      int gathered = static_cast<int>(p.specs.size()) - 1;
      p.add(gemm(c, "attn_q_up", c.T, heads * dqk, m.q_lora_rank, Module::mla_up, {gathered}));
      p.add(gemm(c, "attn_kv_up", c.T, heads * (m.qk_head_dim + dv), m.kv_lora_rank, Module::mla_up, {gathered}));
      int kvu = static_cast<int>(p.specs.size()) - 1;
      p.specs.back().after = {gathered};
      (void)kvu;
    } else {
      add_tp_gather(c, p, "attn", c.h, Module::attn_proj_in);
      int gathered = static_cast<int>(p.specs.size()) - 1;
      p.add(gemm(c, "attn_q_proj", c.T, heads * dqk, c.h, Module::attn_proj_in, {gathered}));
      p.add(gemm(c, "attn_kv_down", c.T, kv_down, c.h, Module::attn_proj_in, {gathered}));
      p.add(norm_op("attn_latent_norm", c.T, m.kv_lora_rank, Module::attn_proj_in));
      p.add(gemm(c, "attn_kv_up", c.T, heads * (m.qk_head_dim + dv), m.kv_lora_rank, Module::mla_up));
    }
  } else {
    dqk = m.kv_channels;
    dv = m.kv_channels;
    kv_heads = m.num_query_groups / c.tp;
    add_tp_gather(c, p, "attn", c.h, Module::attn_proj_in);
    p.add(gemm(c, "attn_qkv", c.T, (heads + 2 * kv_heads) * dqk, c.h, Module::attn_proj_in));
  }
  // Core attention. The q/k/v producers are the ops added since the norm; the core op depends on
  // all of them (they are on the compute stream except nothing else, so the last one is enough).
  int qkv_last = static_cast<int>(p.specs.size()) - 1;
  std::vector<int> qkv_producers = {qkv_last};
  if (m.attention == AttentionKind::mla) qkv_producers = {qkv_last - 1, qkv_last};
  if (!c.training) {
    // Append this step's keys and values to the KV cache (MLA caches the compressed latent).
    const double per_token = m.attention == AttentionKind::mla
                                 ? static_cast<double>(m.kv_lora_rank + m.qk_pos_emb_head_dim)
                                 : static_cast<double>(kv_heads) * (dqk + dv);
    Spec kv = memory_op(OpKind::elementwise, "kv_cache_write", {c.T, 0, 0, 0, 0, 0}, 2.0 * c.T * per_token * kBf16Bytes,
                        0, Module::attn_core, qkv_producers);
    kv.sub = static_cast<std::uint8_t>(ElementwiseKind::copy);
    p.add(kv);
    qkv_last = static_cast<int>(p.specs.size()) - 1;
    qkv_producers = {qkv_last};
  }
  if (c.cp > 1) {
    // Load-balanced causal context parallelism (Megatron's p2p ring): each rank holds 2 chunks of
    // c = seq/(2 cp) tokens; the local 2c x 2c causal block, then (cp - 1) remote steps of half a block.
    const std::int64_t chunk2 = c.seq / c.cp;
    const std::int64_t half_remote = static_cast<std::int64_t>(c.cp - 1) * (c.seq / (2 * c.cp));
    double kv_bytes = kBf16Bytes * c.mbs * static_cast<double>(chunk2) * kv_heads * (dqk + dv);
    Spec xchg = collective("cp_kv_exchange", Collective::all_gather, Group::cp, kv_bytes * c.cp, Role::cp_comm,
                           Module::attn_core, qkv_producers);
    int x = p.add(xchg);
    Spec local = attention_spec(c, "attn_core", chunk2, chunk2, true, heads, kv_heads, dqk, dv);
    local.after = qkv_producers;
    int l = p.add(local);
    Spec remote = attention_spec(c, "attn_core_ring", chunk2, half_remote, false, heads, kv_heads, dqk, dv);
    remote.after = {x, l};
    p.add(remote);
  } else {
    Spec core = attention_spec(c, "attn_core", c.seq, c.seq_kv, c.causal, heads, kv_heads, dqk, dv);
    core.after = qkv_producers;
    p.add(core);
  }
  p.add(gemm(c, "attn_proj", c.T, c.h, heads * dv, Module::attn_out));
  add_tp_reduce(c, p, "attn", Module::attn_out);
  // bias-dropout-add with the residual: read two, write one.
  p.add(memory_op(OpKind::elementwise, "attn_bda", {c.Tsp * c.h, 0, 0, 0, 0, 0}, 3.0 * c.Tsp * c.h * kBf16Bytes,
                  3.0 * c.Tsp * c.h * kBf16Bytes, Module::attn_out));
}

// ---- dense MLP ----
void dense_mlp_block(const Ctx& c, Program& p, const std::string& prefix, std::int64_t ffn, Module mod, int input_op,
                     bool own_norm) {
  if (own_norm) p.add(norm_op(prefix + "_norm", c.Tsp, c.h, Module::mlp_norm, {input_op}));
  add_tp_gather(c, p, prefix, c.h, mod);
  const std::int64_t f = ffn / c.tp;
  const std::int64_t fc1_out = c.swiglu ? 2 * f : f;
  p.add(gemm(c, prefix + "_fc1", c.T, fc1_out, c.h, mod));
  // SwiGLU (or GeLU): read fc1 output, write f.
  double act = (static_cast<double>(fc1_out) + f) * c.T * kBf16Bytes;
  Spec a = memory_op(OpKind::elementwise, prefix + "_act", {c.T * f, 0, 0, 0, 0, 0}, act,
                     (static_cast<double>(fc1_out) * 2 + f) * c.T * kBf16Bytes, mod == Module::mlp ? Module::mlp : mod);
  a.sub = activation_kind(c);
  p.add(a);
  p.add(gemm(c, prefix + "_fc2", c.T, c.h, f, mod));
  add_tp_reduce(c, p, prefix, mod);
}

// ---- MoE block ----
void moe_block(const Ctx& c, const ClassInfo& ci, Program& p, int layer_input) {
  const std::int64_t Tloc = c.Tsp;  // tokens routed by this rank (sequence-parallel rows)
  int norm = p.add(norm_op("mlp_norm", Tloc, c.h, Module::mlp_norm, {layer_input}));
  Spec router = gemm(c, "router", Tloc, c.E, c.h, Module::router, {norm});
  router.dtype = DType::bf16;
  router.bytes = gemm_bytes(Tloc, c.E, c.h, kBf16Bytes);
  router.tokens = static_cast<std::int32_t>(Tloc);
  p.add(router);
  Spec topk = memory_op(OpKind::softmax_topk, "router_topk", {Tloc, c.E, c.topk, 0, 0, 0},
                        static_cast<double>(Tloc) * c.E * (kFp32Bytes + kBf16Bytes), static_cast<double>(Tloc) * c.E * 3 * kFp32Bytes,
                        Module::router);
  topk.tokens = static_cast<std::int32_t>(Tloc);
  int topk_id = p.add(topk);
  if (c.exec.sync_routing_stats) {
    Spec read;
    read.kind = OpKind::host;
    read.name = "moe_routing_stats_read";
    read.sub = static_cast<std::uint8_t>(HostKind::gpu_read);
    read.wall = Wall::host;
    read.bytes = static_cast<double>(c.E) * 8;
    read.module = Module::host;
    read.bwd = Bwd::none;
    read.after = {topk_id};
    p.add(read);
  }
  const std::int64_t routed_rows = Tloc * c.topk;                      // rows this rank sends
  const std::int64_t recv_rows = std::max<std::int64_t>(1, ci.expert_rows);  // rows its experts process
  const bool per_expert = c.exec.expert_execution.kind != ExpertExecutionKind::grouped;
  const Dispatcher disp = c.exec.token_dispatcher;
  const double row_bytes = static_cast<double>(c.h) * kBf16Bytes;

  int shared_input = norm;
  int dispatched = -1;
  // Permute (gather rows into expert order) before the dispatch.
  if (disp == Dispatcher::allgather) {
    if (c.ep > 1) {
      p.add(collective("moe_dispatch", Collective::all_gather, Group::ep, static_cast<double>(Tloc) * c.ep * row_bytes,
                       Role::compute, Module::moe_comm, {topk_id}));
      p.specs.back().tokens = static_cast<std::int32_t>(Tloc * c.ep);
    }
    Spec perm = memory_op(OpKind::permute, "moe_permute", {recv_rows, c.h, 0, 0, 0, 0}, 2.0 * recv_rows * row_bytes,
                          2.0 * recv_rows * row_bytes, Module::moe_pre);
    perm.tokens = static_cast<std::int32_t>(recv_rows);
    dispatched = p.add(perm);
  } else {
    if (disp == Dispatcher::alltoall && !(per_expert && c.ep == 1)) {
      Spec perm = memory_op(OpKind::permute, "moe_permute", {routed_rows, c.h, 0, 0, 0, 0}, 2.0 * routed_rows * row_bytes,
                            2.0 * routed_rows * row_bytes, Module::moe_pre, {topk_id});
      perm.tokens = static_cast<std::int32_t>(routed_rows);
      p.add(perm);
    }
    dispatched = (disp == Dispatcher::alltoall && !(per_expert && c.ep == 1)) ? static_cast<int>(p.specs.size()) - 1
                                                                             : topk_id;
    if (c.ep > 1) {
      Spec a2a = collective("moe_dispatch", Collective::all_to_all, Group::ep, static_cast<double>(routed_rows) * row_bytes,
                            Role::compute, Module::moe_comm);
      a2a.shape = {static_cast<std::int64_t>(routed_rows * row_bytes), 1, 0, 0, 0, 0};
      a2a.tokens = static_cast<std::int32_t>(routed_rows);
      dispatched = p.add(a2a);
      if (c.E_loc > 1 && disp == Dispatcher::alltoall) {
        const std::int64_t rows = recv_rows / c.etp;
        Spec sort = memory_op(OpKind::permute, "moe_sort", {rows, c.h, 0, 0, 0, 0}, 2.0 * rows * row_bytes,
                              2.0 * rows * row_bytes, Module::moe_pre);
        sort.tokens = static_cast<std::int32_t>(rows);
        dispatched = p.add(sort);
      }
    }
    if (c.etp > 1) {
      Spec ag = collective("moe_etp_allgather", Collective::all_gather, Group::etp, static_cast<double>(recv_rows) * row_bytes,
                           Role::compute, Module::moe_comm);
      ag.tokens = static_cast<std::int32_t>(recv_rows);
      dispatched = p.add(ag);
    }
  }
  // Shared experts: overlapped on their own stream, or after the routed experts.
  auto add_shared = [&](int after) {
    if (c.ffn_shared <= 0) return -1;
    const std::size_t first = p.specs.size();
    Program sh;
    dense_mlp_block(c, sh, "shared_expert", c.ffn_shared, Module::shared, -1, false);
    int base = static_cast<int>(first);
    for (std::size_t i = 0; i < sh.specs.size(); ++i) {
      Spec s2 = sh.specs[i];
      for (auto& a : s2.after) a = (a < 0) ? after : a + base;
      if (c.shared_overlap) s2.role = Role::shared;
      p.specs.push_back(std::move(s2));
    }
    return static_cast<int>(p.specs.size()) - 1;
  };
  int shared_out = -1;
  if (c.shared_overlap) shared_out = add_shared(shared_input);

  // Routed experts.
  std::vector<int> expert_outputs;
  const std::int64_t fc1_out = c.swiglu ? 2 * c.ffn_e : c.ffn_e;
  if (!per_expert) {
    const std::int64_t max_rows = (recv_rows + c.E_loc - 1) / c.E_loc;
    auto grouped = [&](std::string name, std::int64_t n, std::int64_t k, std::vector<int> after) {
      Spec g;
      g.kind = OpKind::grouped_gemm;
      g.name = std::move(name);
      g.shape = {recv_rows, n, k, c.E_loc, max_rows, 0};
      g.flops = 2.0 * recv_rows * n * k;
      g.bytes = static_cast<double>(recv_rows) * k * c.gemm_elt + static_cast<double>(c.E_loc) * k * n * c.gemm_elt +
                static_cast<double>(recv_rows) * n * kBf16Bytes;
      g.wall = Wall::compute;
      g.dtype = c.gemm_dtype;
      g.module = Module::moe_expert;
      g.bwd = Bwd::grouped;
      g.tokens = static_cast<std::int32_t>(recv_rows);
      g.after = std::move(after);
      return g;
    };
    p.add(grouped("expert_fc1", fc1_out, c.h, {dispatched}));
    Spec act = memory_op(OpKind::elementwise, "expert_act", {recv_rows * c.ffn_e, 0, 0, 0, 0, 0},
                         (static_cast<double>(fc1_out) + c.ffn_e) * recv_rows * kBf16Bytes,
                         (2.0 * fc1_out + c.ffn_e) * recv_rows * kBf16Bytes, Module::moe_act);
    act.tokens = static_cast<std::int32_t>(recv_rows);
    act.sub = activation_kind(c);
    p.add(act);
    expert_outputs.push_back(p.add(grouped("expert_fc2", c.h, c.ffn_e, {})));
  } else {
    const int nstreams = c.exec.expert_execution.kind == ExpertExecutionKind::streams ? c.exec.expert_execution.streams : 1;
    for (int e = 0; e < c.E_loc; ++e) {
      const std::int64_t rows = recv_rows / c.E_loc + (e < recv_rows % c.E_loc ? 1 : 0);
      const int slot = e % nstreams;
      auto tag = [&](Spec sp) {
        sp.expert = e;
        sp.stream_slot = slot;
        sp.role = slot == 0 ? Role::compute : Role::expert;
        sp.tokens = static_cast<std::int32_t>(rows);
        return sp;
      };
      int g = p.add(tag(memory_op(OpKind::permute, "expert_gather", {rows, c.h, 0, 0, 0, 0}, 2.0 * rows * row_bytes,
                                  2.0 * rows * row_bytes, Module::moe_expert, {dispatched})));
      int up = -1;
      if (c.swiglu) {
        p.add(tag(gemm(c, "expert_gate", rows, c.ffn_e, c.h, Module::moe_expert, {g})));
        up = p.add(tag(gemm(c, "expert_up", rows, c.ffn_e, c.h, Module::moe_expert, {g})));
      } else {
        up = p.add(tag(gemm(c, "expert_fc1", rows, c.ffn_e, c.h, Module::moe_expert, {g})));
      }
      Spec act = memory_op(OpKind::elementwise, "expert_act", {rows * c.ffn_e, 0, 0, 0, 0, 0},
                           (static_cast<double>(fc1_out) + c.ffn_e) * rows * kBf16Bytes,
                           (2.0 * fc1_out + c.ffn_e) * rows * kBf16Bytes, Module::moe_act, {up - (c.swiglu ? 1 : 0), up});
      act.sub = activation_kind(c);
      p.add(tag(act));
      p.add(tag(gemm(c, c.swiglu ? "expert_down" : "expert_fc2", rows, c.h, c.ffn_e, Module::moe_expert)));
      int sc = p.add(tag(memory_op(OpKind::unpermute, "expert_scatter", {rows, c.h, 0, 0, 0, 0}, 3.0 * rows * row_bytes,
                                   2.0 * rows * row_bytes, Module::moe_expert)));
      expert_outputs.push_back(sc);
    }
  }
  // Combine.
  int combined = -1;
  std::vector<int> combined_set;
  if (disp == Dispatcher::allgather) {
    Spec unperm = memory_op(OpKind::unpermute, "moe_unpermute", {recv_rows, c.h, 0, 0, 0, 0}, 3.0 * recv_rows * row_bytes,
                            2.0 * recv_rows * row_bytes, Module::moe_post, expert_outputs);
    unperm.tokens = static_cast<std::int32_t>(recv_rows);
    combined = p.add(unperm);
    if (c.ep > 1) {
      combined = p.add(collective("moe_combine", Collective::reduce_scatter, Group::ep,
                                  static_cast<double>(Tloc) * c.ep * row_bytes, Role::compute, Module::moe_comm));
    }
  } else {
    int last = -1;
    std::vector<int> after = expert_outputs;
    if (c.etp > 1) {
      Spec rs = collective("moe_etp_reducescatter", Collective::reduce_scatter, Group::etp,
                           static_cast<double>(recv_rows) * row_bytes, Role::compute, Module::moe_comm, after);
      last = p.add(rs);
      after = {last};
    }
    if (c.ep > 1) {
      if (c.E_loc > 1 && disp == Dispatcher::alltoall) {
        const std::int64_t rows = recv_rows / c.etp;
        last = p.add(memory_op(OpKind::unpermute, "moe_unsort", {rows, c.h, 0, 0, 0, 0}, 2.0 * rows * row_bytes,
                               2.0 * rows * row_bytes, Module::moe_post, after));
        after = {last};
      }
      Spec a2a = collective("moe_combine", Collective::all_to_all, Group::ep,
                            static_cast<double>(routed_rows) * row_bytes * ci.load, Role::compute, Module::moe_comm, after);
      a2a.shape = {static_cast<std::int64_t>(routed_rows * row_bytes), 2, 0, 0, 0, 0};
      a2a.tokens = static_cast<std::int32_t>(recv_rows / c.etp);
      last = p.add(a2a);
      after = {last};
    }
    if (disp == Dispatcher::alltoall && !(per_expert && c.ep == 1)) {
      Spec unperm = memory_op(OpKind::unpermute, "moe_unpermute", {routed_rows, c.h, 0, 0, 0, 0},
                              3.0 * routed_rows * row_bytes, 2.0 * routed_rows * row_bytes, Module::moe_post, after);
      unperm.tokens = static_cast<std::int32_t>(routed_rows);
      last = p.add(unperm);
      after = {last};
    }
    combined_set = after;  // several entries: the experts' scatter-adds write the output directly
  }
  if (!c.shared_overlap) {
    shared_out = add_shared(norm);
  }
  std::vector<int> bda_after = combined_set.empty() ? std::vector<int>{combined} : combined_set;
  if (shared_out >= 0) bda_after.push_back(shared_out);
  p.add(memory_op(OpKind::elementwise, "mlp_bda", {Tloc * c.h, 0, 0, 0, 0, 0}, 3.0 * Tloc * row_bytes,
                  3.0 * Tloc * row_bytes, Module::moe_post, bda_after));
}

Program layer_program(const Ctx& c, const ClassInfo& ci, int layer) {
  Program p;
  attention_block(c, p);
  const int attn_out = static_cast<int>(p.specs.size()) - 1;
  if (c.s.model.layer_is_moe(layer)) {
    moe_block(c, ci, p, attn_out);
  } else {
    p.add(norm_op("mlp_norm", c.Tsp, c.h, Module::mlp_norm, {attn_out}));
    dense_mlp_block(c, p, "mlp", c.ffn, Module::mlp, -1, false);
    p.add(memory_op(OpKind::elementwise, "mlp_bda", {c.Tsp * c.h, 0, 0, 0, 0, 0}, 3.0 * c.Tsp * c.h * kBf16Bytes,
                    3.0 * c.Tsp * c.h * kBf16Bytes, Module::mlp));
  }
  return p;
}

Program embedding_program(const Ctx& c) {
  Program p;
  Spec emb = memory_op(OpKind::embedding, "embedding", {c.T, c.h, 0, 0, 0, 0}, 2.0 * c.T * c.h * kBf16Bytes + c.T * 8.0,
                       2.0 * c.T * c.h * kFp32Bytes, Module::embedding, {-1});
  p.add(emb);
  if (c.tp > 1) {
    if (c.sp) {
      p.add(collective("embedding_sp_reducescatter", Collective::reduce_scatter, Group::tp,
                       static_cast<double>(c.T) * c.h * kBf16Bytes, Role::compute, Module::embedding));
    } else {
      p.add(collective("embedding_tp_allreduce", Collective::all_reduce, Group::tp, static_cast<double>(c.T) * c.h * kBf16Bytes,
                       Role::compute, Module::embedding));
    }
  }
  return p;
}

Program head_program(const Ctx& c) {
  Program p;
  p.add(norm_op("final_norm", c.Tsp, c.h, Module::head, {-1}));
  if (c.tp > 1 && c.sp) {
    p.add(collective("lm_head_sp_allgather", Collective::all_gather, Group::tp, static_cast<double>(c.T) * c.h * kBf16Bytes,
                     Role::compute, Module::head));
  }
  Spec lm = gemm(c, "lm_head", c.T, c.vocab / c.tp, c.h, Module::head);
  lm.dtype = DType::bf16;
  lm.bytes = gemm_bytes(c.T, c.vocab / c.tp, c.h, kBf16Bytes);
  p.add(lm);
  // Vocab-parallel cross entropy: logits read (fp32 softmax), plus 3 small TP all-reduces
  // (max, sum of exponentials, target logit) fused here into one of 3 floats per token.
  const double logits = static_cast<double>(c.T) * (c.vocab / c.tp);
  p.add(memory_op(OpKind::cross_entropy, "loss", {c.T, c.vocab / c.tp, 0, 0, 0, 0}, logits * (kBf16Bytes + kFp32Bytes),
                  logits * (kFp32Bytes + kBf16Bytes), Module::head));
  if (c.tp > 1) {
    p.add(collective("loss_tp_allreduce", Collective::all_reduce, Group::tp, static_cast<double>(c.T) * 3 * kFp32Bytes,
                     Role::compute, Module::head));
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// Instantiation of programs into ops
// ---------------------------------------------------------------------------------------------

class Emitter {
 public:
  Emitter(const Ctx& c, const ClassInfo& ci, GraphTables& tables, ClassBuilder& b)
      : c_(c), ci_(ci), t_(tables), b_(b) {
    compute_ = t_.stream("compute", StreamKind::compute);
  }

  std::uint8_t stream_for(const Spec& sp) {
    switch (sp.role) {
      case Role::compute: return compute_;
      case Role::tp_comm: return t_.stream("tp_comm", StreamKind::communication);
      case Role::cp_comm: return t_.stream("cp_comm", StreamKind::communication);
      case Role::shared: return t_.stream("shared_expert", StreamKind::compute);
      case Role::expert: return t_.stream("expert_" + std::to_string(sp.stream_slot), StreamKind::compute);
    }
    return compute_;
  }
  [[nodiscard]] std::uint8_t compute_stream() const { return compute_; }

  std::uint8_t graph_of(const Spec& sp, bool dense_layer) {
    const auto& e = c_.exec;
    if (e.cuda_graph_scope.empty() || sp.kind == OpKind::host) return 0;
    if (e.graph_scope("full_iteration")) return t_.graph_scope("full_iteration");
    switch (sp.module) {
      case Module::attn_norm:
      case Module::attn_proj_in:
      case Module::mla_up:
      case Module::attn_core:
      case Module::attn_out:
        return e.graph_scope("attn") ? t_.graph_scope("attn") : 0;
      case Module::mlp_norm:
        if (dense_layer) return e.graph_scope("mlp") ? t_.graph_scope("mlp") : 0;
        return e.graph_scope("moe_router") ? t_.graph_scope("moe_router")
               : e.graph_scope("moe_preprocess") ? t_.graph_scope("moe_preprocess")
                                                 : 0;
      case Module::mlp:
        return e.graph_scope("mlp") ? t_.graph_scope("mlp") : 0;
      case Module::router:
        if (e.graph_scope("moe_router")) return t_.graph_scope("moe_router");
        return e.graph_scope("moe_preprocess") ? t_.graph_scope("moe_preprocess") : 0;
      case Module::moe_pre:
        return e.graph_scope("moe_preprocess") ? t_.graph_scope("moe_preprocess") : 0;
      default:
        return 0;
    }
  }

  Op base_op(const Spec& sp, const std::string& phase, int layer, int mb, int chunk, std::uint8_t flags,
             bool dense_layer) {
    Op op;
    op.kind = sp.kind;
    op.shape = sp.shape;
    op.flops = sp.flops;
    op.bytes = sp.bytes;
    op.phase = t_.phase(phase);
    op.layer = static_cast<std::int16_t>(layer);
    op.microbatch = static_cast<std::int16_t>(mb);
    op.expert = static_cast<std::int16_t>(sp.expert);
    op.chunk = static_cast<std::int16_t>(chunk);
    op.stream = stream_for(sp);
    op.wall = sp.wall;
    op.sub = sp.sub;
    op.group = sp.group;
    op.group_size = static_cast<std::int16_t>(c_.layout.group_size(sp.group));
    op.dtype = sp.dtype;
    op.tokens = sp.tokens;
    op.flags = static_cast<std::uint8_t>(sp.flags | flags);
    op.graph = graph_of(sp, dense_layer);
    if (sp.kind == OpKind::norm) {
      op.sub = static_cast<std::uint8_t>(c_.s.model.normalization == Normalization::layernorm ? NormKind::layernorm
                                                                                                : NormKind::rmsnorm);
    }
    if (sp.kind == OpKind::host) op.stream = t_.stream("host", StreamKind::host);
    return op;
  }

  // Forward (or recompute when `recompute`): returns the op id of each spec (kNoOp when skipped).
  std::vector<std::uint32_t> forward(const Program& p, int layer, int mb, int chunk, std::uint32_t input,
                                     bool recompute, const std::vector<bool>* subset, bool dense_layer) {
    std::vector<std::uint32_t> ids(p.specs.size(), kNoOp);
    const char* suffix = recompute ? "_recompute" : "_fwd";
    for (std::size_t i = 0; i < p.specs.size(); ++i) {
      if (subset && !(*subset)[i]) continue;
      const Spec& sp = p.specs[i];
      if (recompute && sp.kind == OpKind::host) continue;
      deps_.clear();
      for (int a : sp.after) {
        if (a < 0) deps_.push_back(input);
        else deps_.push_back(ids[static_cast<std::size_t>(a)]);
      }
      Op op = base_op(sp, sp.name + suffix, layer, mb, chunk, recompute ? kRecompute : 0, dense_layer);
      ids[i] = b_.emit(op, deps_.data(), deps_.data() + deps_.size());
    }
    return ids;
  }

  // Backward: returns the op id that produces the program input's gradient (or the last op).
  std::uint32_t backward(const Program& p, int layer, int mb, int chunk, std::uint32_t grad_in,
                         const std::vector<std::uint32_t>& recomputed, bool dense_layer) {
    const std::size_t n = p.specs.size();
    // Consumers of each spec.
    std::vector<std::vector<int>> consumers(n);
    for (std::size_t j = 0; j < n; ++j) {
      for (int a : p.specs[j].after) {
        if (a >= 0) consumers[static_cast<std::size_t>(a)].push_back(static_cast<int>(j));
      }
    }
    std::vector<std::uint32_t> grad_of(n, kNoOp);  // op producing d(input of spec) ... i.e. the spec's dgrad
    std::uint32_t last = grad_in;
    std::uint32_t input_grad = kNoOp;
    for (std::size_t ii = n; ii-- > 0;) {
      const Spec& sp = p.specs[ii];
      if (sp.bwd == Bwd::none) continue;
      deps_.clear();
      if (consumers[ii].empty() || ii == n - 1) deps_.push_back(grad_in);
      for (int j : consumers[ii]) {
        if (grad_of[static_cast<std::size_t>(j)] != kNoOp) deps_.push_back(grad_of[static_cast<std::size_t>(j)]);
      }
      if (recomputed.size() == n && recomputed[ii] != kNoOp) deps_.push_back(recomputed[ii]);
      std::uint32_t id = kNoOp;
      const std::uint8_t fl = kBackward;
      switch (sp.bwd) {
        case Bwd::gemm: {
          Op d = base_op(sp, sp.name + "_dgrad", layer, mb, chunk, fl, dense_layer);
          d.shape = {sp.shape[0], sp.shape[2], sp.shape[1], sp.shape[3], 0, 0};
          d.bytes = gemm_bytes(sp.shape[0], sp.shape[2], sp.shape[1], sp.dtype == DType::fp8 ? 1.0 : 2.0);
          id = b_.emit(d, deps_.data(), deps_.data() + deps_.size());
          Op w = base_op(sp, sp.name + "_wgrad", layer, mb, chunk, fl | kWgrad, dense_layer);
          w.shape = {sp.shape[2], sp.shape[1], sp.shape[0], sp.shape[3], 0, 0};
          w.bytes = gemm_bytes(sp.shape[2], sp.shape[1], sp.shape[0], sp.dtype == DType::fp8 ? 1.0 : 2.0);
          b_.emit(w, {id});
          break;
        }
        case Bwd::grouped: {
          Op d = base_op(sp, sp.name + "_dgrad", layer, mb, chunk, fl, dense_layer);
          d.shape = {sp.shape[0], sp.shape[2], sp.shape[1], sp.shape[3], sp.shape[4], 0};
          id = b_.emit(d, deps_.data(), deps_.data() + deps_.size());
          Op w = base_op(sp, sp.name + "_wgrad", layer, mb, chunk, fl | kWgrad, dense_layer);
          // dW_g [k x n] = X_g^T [k x r_g] dY_g [r_g x n]: the rows are the reduction dimension.
          w.shape = {sp.shape[0], sp.shape[1], sp.shape[2], sp.shape[3], sp.shape[4], 1};
          b_.emit(w, {id});
          break;
        }
        case Bwd::attention: {
          Op a = base_op(sp, sp.name + "_bwd", layer, mb, chunk, fl, dense_layer);
          a.flops = 2.0 * sp.flops;
          a.bytes = sp.bwd_bytes;
          id = b_.emit(a, deps_.data(), deps_.data() + deps_.size());
          break;
        }
        case Bwd::same_kind:
        case Bwd::swap_permute: {
          Op e = base_op(sp, sp.name + "_bwd", layer, mb, chunk, fl, dense_layer);
          e.bytes = sp.bwd_bytes;
          e.flops = 0;
          if (sp.bwd == Bwd::swap_permute) e.kind = sp.kind == OpKind::permute ? OpKind::unpermute : OpKind::permute;
          if (sp.kind == OpKind::elementwise) {
            auto k = static_cast<ElementwiseKind>(sp.sub);
            if (k == ElementwiseKind::swiglu) e.sub = static_cast<std::uint8_t>(ElementwiseKind::swiglu_bwd);
            if (k == ElementwiseKind::gelu) e.sub = static_cast<std::uint8_t>(ElementwiseKind::gelu_bwd);
          }
          id = b_.emit(e, deps_.data(), deps_.data() + deps_.size());
          break;
        }
        case Bwd::collective: {
          Op cl = base_op(sp, sp.name + "_bwd", layer, mb, chunk, fl, dense_layer);
          auto kind = static_cast<Collective>(sp.sub);
          if (kind == Collective::all_gather) cl.sub = static_cast<std::uint8_t>(Collective::reduce_scatter);
          if (kind == Collective::reduce_scatter) cl.sub = static_cast<std::uint8_t>(Collective::all_gather);
          if (kind == Collective::all_to_all && sp.shape[1] != 0) {
            // The gradient of a dispatch travels like a combine and vice versa.
            const std::int64_t routed = sp.shape[1] == 1 ? 2 : 1;
            cl.shape[1] = routed;
            cl.bytes = static_cast<double>(sp.shape[0]) * (routed == 2 ? ci_.load : 1.0);
          }
          id = b_.emit(cl, deps_.data(), deps_.data() + deps_.size());
          break;
        }
        case Bwd::none:
          break;
      }
      grad_of[ii] = id;
      if (id != kNoOp) last = id;
      // The program input's gradient comes from the specs that read the input.
      for (int a : sp.after) {
        if (a < 0) input_grad = id;
      }
    }
    return input_grad != kNoOp ? input_grad : last;
  }

 private:
  const Ctx& c_;
  const ClassInfo& ci_;
  GraphTables& t_;
  ClassBuilder& b_;
  std::uint8_t compute_;
  std::vector<std::uint32_t> deps_;
};

// A data-parallel gradient bucket (Megatron's DDP): consecutive layers in backward order.
struct Bucket {
  bool expert = false;
  double params = 0;
  int chunk = 0;
  int closing_layer = 0;  // the layer whose backward completes the bucket (lowest layer); -1 embedding
  std::vector<int> layers;
};

// ---------------------------------------------------------------------------------------------
// The schedule
// ---------------------------------------------------------------------------------------------

struct SchedItem {
  bool forward;
  int mb;
  int chunk;
};

// Megatron-Core's order of forward and backward micro-batches on one pipeline rank.
std::vector<SchedItem> schedule(const Ctx& c, int stage) {
  std::vector<SchedItem> out;
  const int M = c.num_mb;
  if (c.vpp == 1) {
    const int warmup = std::min(c.pp - stage - 1, M);
    const int remaining = M - warmup;
    for (int i = 0; i < warmup; ++i) out.push_back({true, i, 0});
    for (int i = 0; i < remaining; ++i) {
      out.push_back({true, warmup + i, 0});
      out.push_back({false, i, 0});
    }
    for (int i = 0; i < warmup; ++i) out.push_back({false, remaining + i, 0});
    return out;
  }
  // Interleaved (microbatch_group_size_per_vp_stage = pp).
  const int total = M * c.vpp;
  int warmup = (c.pp - stage - 1) * 2 + (c.vpp - 1) * c.pp;
  warmup = std::min(warmup, total);
  const int remaining = total - warmup;
  auto chunk_of = [&](int k, bool fwd) {
    int in_group = k % (c.pp * c.vpp);
    int ch = in_group / c.pp;
    return fwd ? ch : c.vpp - ch - 1;
  };
  auto mb_of = [&](int k) {
    int group = k / (c.pp * c.vpp);
    return group * c.pp + k % c.pp;
  };
  for (int k = 0; k < warmup; ++k) out.push_back({true, mb_of(k), chunk_of(k, true)});
  for (int i = 0; i < remaining; ++i) {
    int kf = warmup + i;
    out.push_back({true, mb_of(kf), chunk_of(kf, true)});
    out.push_back({false, mb_of(i), chunk_of(i, false)});
  }
  for (int k = remaining; k < total; ++k) out.push_back({false, mb_of(k), chunk_of(k, false)});
  return out;
}

bool recompute_selected(const TrainSpec& t, const Spec& sp, bool moe_layer) {
  if (t.recompute_granularity != RecomputeGranularity::selective) return false;
  switch (sp.module) {
    case Module::attn_core: return t.recompute_module("core_attn") && sp.kind == OpKind::attention;
    case Module::attn_norm: return t.recompute_module("layernorm");
    case Module::mlp_norm: return t.recompute_module("layernorm") || (moe_layer && t.recompute_module("moe"));
    case Module::mla_up: return t.recompute_module("mla_up_proj");
    case Module::mlp: return t.recompute_module("mlp");
    case Module::moe_act: return t.recompute_module("moe_act") || t.recompute_module("moe");
    case Module::shared: return t.recompute_module("shared_experts") || t.recompute_module("moe");
    case Module::router:
    case Module::moe_pre:
    case Module::moe_comm:
    case Module::moe_expert:
    case Module::moe_post:
      return moe_layer && t.recompute_module("moe");
    default: return false;
  }
}

void build_class(const Ctx& c, const ClassInfo& ci, GraphTables& tables, RankClass& rc) {
  ClassBuilder b(rc);
  Emitter em(c, ci, tables, b);
  const int stage = ci.stage;
  const auto& t = *c.train;

  // Layers of each chunk on this stage, and parameters.
  std::vector<std::vector<int>> chunk_layers(static_cast<std::size_t>(c.vpp));
  for (int ch = 0; ch < c.vpp; ++ch) chunk_layers[static_cast<std::size_t>(ch)] = c.stages.chunk_layers(stage, ch);
  rc.layers = c.stages.stage_layers(stage);
  const bool has_embedding = c.stages.is_first_vstage(stage, 0);
  const bool has_head = c.stages.is_last_vstage(stage, c.vpp - 1);
  const double emb_params = embedding_parameters(c.s);
  const double head_params = head_parameters(c.s, has_embedding);
  const ParameterCount rank_params = rank_parameters(c.s, rc.layers, has_embedding, has_head);
  rc.dense_params = rank_params.dense;
  rc.expert_params = rank_params.expert;
  std::unordered_map<int, ParameterCount> params;
  for (int l : rc.layers) params[l] = layer_parameters(c.s, l);

  // Programs per layer (shapes only depend on the layer's kind).
  std::unordered_map<int, Program> programs;
  for (int l : rc.layers) programs.emplace(l, layer_program(c, ci, l));
  const Program emb = embedding_program(c);
  const Program head = head_program(c);

  // Gradient buckets, in backward order per chunk (dense and expert separately).
  std::vector<Bucket> buckets;
  const int dense_group = c.layout.group_size(Group::dp_cp);
  const int expert_group = c.layout.group_size(Group::edp);
  {
    for (int ch = c.vpp - 1; ch >= 0; --ch) {
      Bucket dense;
      dense.chunk = ch;
      Bucket expert;
      expert.chunk = ch;
      expert.expert = true;
      auto close = [&](Bucket& bk, int layer) {
        if (bk.params > 0) {
          bk.closing_layer = layer;
          buckets.push_back(bk);
        }
        bk.params = 0;
        bk.layers.clear();
      };
      const auto& ls = chunk_layers[static_cast<std::size_t>(ch)];
      const bool head_here = has_head && ch == c.vpp - 1;
      const bool emb_here = has_embedding && ch == 0;
      if (head_here) {
        dense.params += head_params;
        dense.layers.push_back(c.s.model.num_layers);
      }
      for (auto it = ls.rbegin(); it != ls.rend(); ++it) {
        const auto& lp = params[*it];
        dense.params += lp.dense;
        dense.layers.push_back(*it);
        if (lp.expert > 0) {
          expert.params += lp.expert;
          expert.layers.push_back(*it);
        }
        if (dense.params >= t.grad_bucket_size_params) close(dense, *it);
        if (expert.params >= t.grad_bucket_size_params) close(expert, *it);
      }
      if (emb_here) {
        dense.params += emb_params;
        dense.layers.push_back(-1);
      }
      int lowest = ls.empty() ? (emb_here ? -1 : c.s.model.num_layers) : ls.front();
      close(dense, emb_here ? -1 : lowest);
      close(expert, lowest);
    }
  }

  const std::uint8_t dp_stream = tables.stream("dp_comm", StreamKind::communication);
  auto bucket_op = [&](const Bucket& bk, bool grad) {
    const int gsize = bk.expert ? expert_group : dense_group;
    Op op;
    op.kind = OpKind::collective;
    op.wall = Wall::communication;
    op.group = bk.expert ? Group::edp : Group::dp_cp;
    op.group_size = static_cast<std::int16_t>(gsize);
    op.stream = dp_stream;
    op.layer = static_cast<std::int16_t>(bk.closing_layer);
    op.chunk = static_cast<std::int16_t>(bk.chunk);
    const std::string pre = bk.expert ? "edp" : "dp";
    if (grad) {
      const bool rs = t.use_distributed_optimizer;
      op.sub = static_cast<std::uint8_t>(rs ? Collective::reduce_scatter : Collective::all_reduce);
      op.bytes = bk.params * kFp32Bytes;
      op.phase = tables.phase(pre + (rs ? "_grad_reduce_scatter" : "_grad_allreduce"));
    } else {
      op.sub = static_cast<std::uint8_t>(Collective::all_gather);
      op.bytes = bk.params * kBf16Bytes;
      op.phase = tables.phase(pre + "_param_allgather");
    }
    op.shape = {static_cast<std::int64_t>(op.bytes), 0, 0, 0, 0, 0};
    return op;
  };
  auto bucket_needs_comm = [&](const Bucket& bk) { return (bk.expert ? expert_group : dense_group) > 1; };

  // Step prologue: overlapped parameter all-gather of the distributed optimizer (for this step's
  // forward; Megatron launches it as the previous step's optimizer finishes).
  std::unordered_map<int, std::uint32_t> param_ag_of_layer;  // layer -> all-gather op
  if (t.use_distributed_optimizer && t.overlap_param_gather) {
    for (auto it = buckets.rbegin(); it != buckets.rend(); ++it) {
      if (!bucket_needs_comm(*it)) continue;
      std::uint32_t id = b.emit(bucket_op(*it, false), {});
      for (int l : it->layers) param_ag_of_layer[l] = id;
    }
  }

  // Last backward item of each chunk (when its gradient buckets become ready).
  const auto items = schedule(c, stage);
  std::vector<int> last_bwd_item(static_cast<std::size_t>(c.vpp), -1);
  std::vector<bool> first_fwd_done(static_cast<std::size_t>(c.vpp), false);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!items[i].forward) last_bwd_item[static_cast<std::size_t>(items[i].chunk)] = static_cast<int>(i);
  }

  const std::uint8_t copy_stream = tables.stream("copy", StreamKind::copy);
  // One stream per direction of travel and role, so that a strict FIFO per stream cannot deadlock
  // (the interleaved warm-up sends to the next stage before it receives from the previous one).
  const std::uint8_t pp_fwd_send = tables.stream("pp_fwd_send", StreamKind::communication);
  const std::uint8_t pp_fwd_recv = tables.stream("pp_fwd_recv", StreamKind::communication);
  const std::uint8_t pp_bwd_send = tables.stream("pp_bwd_send", StreamKind::communication);
  const std::uint8_t pp_bwd_recv = tables.stream("pp_bwd_recv", StreamKind::communication);
  const double p2p_bytes = static_cast<double>(c.Tsp) * c.h * kBf16Bytes;
  // Input of one micro-batch: tokens, labels, loss mask, position ids (int64 each).
  const double input_bytes = static_cast<double>(c.mbs) * c.seq / c.cp * 4 * 8;

  auto emit_copy = [&](int mb, std::uint32_t* out) {
    Op cp;
    cp.kind = OpKind::copy;
    cp.sub = static_cast<std::uint8_t>(CopyKind::h2d_pinned);
    cp.wall = Wall::memory;
    cp.bytes = input_bytes;
    cp.shape = {static_cast<std::int64_t>(input_bytes), 0, 0, 0, 0, 0};
    cp.stream = copy_stream;
    cp.microbatch = static_cast<std::int16_t>(mb);
    cp.phase = tables.phase("host_to_device");
    cp.flags = kDataLoad;
    *out = b.emit(cp, {});
    if (c.exec.sync_after_copy) {
      Op sy;
      sy.kind = OpKind::host;
      sy.sub = static_cast<std::uint8_t>(HostKind::stream_sync);
      sy.wall = Wall::host;
      sy.stream = tables.stream("host", StreamKind::host);
      sy.microbatch = static_cast<std::int16_t>(mb);
      sy.phase = tables.phase("host_to_device_sync");
      sy.flags = kDataLoad;
      b.emit(sy, {*out});
    }
  };

  auto p2p = [&](bool send, bool fwd_dir, int mb, int recv_chunk, int layer, std::uint32_t dep) {
    Op op;
    op.kind = send ? OpKind::send : OpKind::recv;
    op.wall = Wall::communication;
    op.group = Group::pp;
    op.group_size = static_cast<std::int16_t>(c.pp);
    op.bytes = p2p_bytes;
    op.shape = {static_cast<std::int64_t>(p2p_bytes), 0, 0, 0, 0, 0};
    op.stream = fwd_dir ? (send ? pp_fwd_send : pp_fwd_recv) : (send ? pp_bwd_send : pp_bwd_recv);
    op.microbatch = static_cast<std::int16_t>(mb);
    op.layer = static_cast<std::int16_t>(layer);
    op.tag = mb * c.vpp + recv_chunk;
    // Forward activations travel to the next stage, gradients to the previous one.
    op.peer = static_cast<std::int8_t>((fwd_dir == send) ? +1 : -1);
    op.phase = tables.phase(std::string("pp_") + (send ? "send" : "recv") + (fwd_dir ? "_fwd" : "_bwd"));
    return b.emit(op, {dep});
  };

  // Full recompute groups.
  auto full_recompute = [&](int chunk, int idx_in_chunk) -> std::pair<int, int> {
    // returns [first, last] index range of the checkpoint group containing idx, or {-1,-1}
    if (t.recompute_granularity != RecomputeGranularity::full) return {-1, -1};
    const int n = t.recompute_num_layers;
    const int count = static_cast<int>(chunk_layers[static_cast<std::size_t>(chunk)].size());
    if (t.recompute_method == RecomputeMethod::block) {
      if (idx_in_chunk < n) return {idx_in_chunk, idx_in_chunk};
      return {-1, -1};
    }
    int first = (idx_in_chunk / n) * n;
    return {first, std::min(first + n, count) - 1};
  };

  std::vector<std::uint32_t> copy_of_mb(static_cast<std::size_t>(c.num_mb), kNoOp);
  for (std::size_t it = 0; it < items.size(); ++it) {
    const SchedItem& item = items[it];
    const int ch = item.chunk;
    const int mb = item.mb;
    const auto& ls = chunk_layers[static_cast<std::size_t>(ch)];
    const bool first_v = c.stages.is_first_vstage(stage, ch);
    const bool last_v = c.stages.is_last_vstage(stage, ch);
    const int first_layer = ls.empty() ? -1 : ls.front();
    const int last_layer = ls.empty() ? -1 : ls.back();
    if (item.forward) {
      std::uint32_t input = kNoOp;
      if (first_v || last_v) {
        emit_copy(mb, &copy_of_mb[static_cast<std::size_t>(mb)]);
        if (first_v) input = copy_of_mb[static_cast<std::size_t>(mb)];
      }
      if (!first_v) input = p2p(false, true, mb, ch, first_layer, kNoOp);
      if (first_v) {
        std::uint32_t ag = kNoOp;
        if (auto f = param_ag_of_layer.find(-1); f != param_ag_of_layer.end() && !first_fwd_done[0]) ag = f->second;
        auto ids = em.forward(emb, -1, mb, ch, input, false, nullptr, false);
        b.add_dep(ids.front(), ag);
        input = ids.back();
      }
      for (int l : ls) {
        std::uint32_t in = input;
        auto f = param_ag_of_layer.find(l);
        const Program& p = programs.at(l);
        auto ids = em.forward(p, l, mb, ch, in, false, nullptr, !c.s.model.layer_is_moe(l));
        if (f != param_ag_of_layer.end() && !first_fwd_done[static_cast<std::size_t>(ch)]) {
          b.add_dep(ids.front(), f->second);  // the layer's parameters, first micro-batch only
        }
        input = ids.back();
      }
      if (last_v) {
        auto ids = em.forward(head, -1, mb, ch, input, false, nullptr, false);
        input = ids.back();
      } else {
        const int recv_chunk = (stage == c.pp - 1) ? ch + 1 : ch;
        p2p(true, true, mb, recv_chunk, last_layer, input);
      }
      first_fwd_done[static_cast<std::size_t>(ch)] = true;
    } else {
      std::uint32_t grad = kNoOp;
      if (last_v) {
        auto ids = std::vector<std::uint32_t>{};
        grad = em.backward(head, -1, mb, ch, static_cast<std::uint32_t>(rc.ops.size() - 1), ids, false);
      } else {
        grad = p2p(false, false, mb, ch, last_layer, kNoOp);
      }
      const int count = static_cast<int>(ls.size());
      for (int idx = count - 1; idx >= 0; --idx) {
        const int l = ls[static_cast<std::size_t>(idx)];
        const Program& p = programs.at(l);
        const bool moe = c.s.model.layer_is_moe(l);
        std::vector<std::uint32_t> rec;
        auto [g0, g1] = full_recompute(ch, idx);
        if (g0 >= 0 && idx == g1) {
          // Re-run the forward of the whole checkpoint group, then go backward through it.
          std::uint32_t in = kNoOp;
          for (int j = g0; j <= g1; ++j) {
            const int lj = ls[static_cast<std::size_t>(j)];
            auto ids = em.forward(programs.at(lj), lj, mb, ch, in, true, nullptr, !c.s.model.layer_is_moe(lj));
            in = ids.back();
          }
        } else if (t.recompute_granularity == RecomputeGranularity::selective) {
          std::vector<bool> subset(p.specs.size(), false);
          bool any = false;
          for (std::size_t i = 0; i < p.specs.size(); ++i) {
            subset[i] = recompute_selected(t, p.specs[i], moe);
            any = any || subset[i];
          }
          if (any) rec = em.forward(p, l, mb, ch, kNoOp, true, &subset, !moe);
        }
        grad = em.backward(p, l, mb, ch, grad, rec, !moe);
        // Overlapped gradient reduction: buckets close as the last micro-batch's backward passes.
        if (t.overlap_grad_reduce && static_cast<int>(it) == last_bwd_item[static_cast<std::size_t>(ch)]) {
          for (const auto& bk : buckets) {
            if (bk.chunk == ch && bk.closing_layer == l && bucket_needs_comm(bk)) {
              b.emit(bucket_op(bk, true), {static_cast<std::uint32_t>(rc.ops.size() - 1)});
            }
          }
        }
      }
      if (first_v) {
        std::vector<std::uint32_t> none;
        grad = em.backward(emb, -1, mb, ch, grad, none, false);
        if (t.overlap_grad_reduce && static_cast<int>(it) == last_bwd_item[static_cast<std::size_t>(ch)]) {
          for (const auto& bk : buckets) {
            if (bk.chunk == ch && bk.closing_layer == -1 && bucket_needs_comm(bk)) {
              b.emit(bucket_op(bk, true), {static_cast<std::uint32_t>(rc.ops.size() - 1)});
            }
          }
        }
      } else {
        const int recv_chunk = (stage == 0) ? ch - 1 : ch;
        p2p(true, false, mb, recv_chunk, first_layer, grad);
      }
    }
  }

  // ---- epilogue: gradient reduction, optimizer, parameter all-gather, metrics ----
  const std::uint32_t last_compute = static_cast<std::uint32_t>(rc.ops.size() - 1);
  std::vector<std::uint32_t> reductions;
  if (!t.overlap_grad_reduce) {
    for (const auto& bk : buckets) {
      if (bucket_needs_comm(bk)) reductions.push_back(b.emit(bucket_op(bk, true), {last_compute}));
    }
  } else {
    for (std::size_t i = 0; i < rc.ops.size(); ++i) {
      const auto& op = rc.ops[i];
      if (op.stream == dp_stream && op.sub != static_cast<std::uint8_t>(Collective::all_gather)) {
        reductions.push_back(static_cast<std::uint32_t>(i));
      }
    }
  }
  if (!c.s.model.untie_embeddings_and_output_weights && c.pp > 1 && (has_embedding || has_head)) {
    Op op;
    op.kind = OpKind::collective;
    op.wall = Wall::communication;
    op.sub = static_cast<std::uint8_t>(Collective::all_reduce);
    op.group = Group::embedding;
    op.group_size = 2;
    op.bytes = emb_params * kFp32Bytes;
    op.shape = {static_cast<std::int64_t>(op.bytes), 0, 0, 0, 0, 0};
    op.stream = dp_stream;
    op.phase = tables.phase("embedding_grad_allreduce");
    reductions.push_back(b.emit(op, {last_compute}));
  }
  const double dense_shard = t.use_distributed_optimizer ? rc.dense_params / dense_group : rc.dense_params;
  const double expert_shard = t.use_distributed_optimizer ? rc.expert_params / expert_group : rc.expert_params;
  const double shard = dense_shard + expert_shard;
  {
    // Gradient norm (clipping): read the local gradient shard, then one float reduced over all ranks.
    Op norm;
    norm.kind = OpKind::elementwise;
    norm.sub = static_cast<std::uint8_t>(ElementwiseKind::reduce);
    norm.wall = Wall::memory;
    norm.bytes = shard * kFp32Bytes;
    norm.shape = {static_cast<std::int64_t>(shard), 0, 0, 0, 0, 0};
    norm.stream = em.compute_stream();
    norm.phase = tables.phase("optimizer_grad_norm");
    std::uint32_t n = b.emit(norm, reductions.data(), reductions.data() + reductions.size());
    std::uint32_t prev = n;
    if (c.layout.world() > 1) {
      Op ar;
      ar.kind = OpKind::collective;
      ar.wall = Wall::communication;
      ar.sub = static_cast<std::uint8_t>(Collective::all_reduce);
      ar.group = Group::world;
      ar.group_size = static_cast<std::int16_t>(std::min(c.layout.world(), 32767));
      ar.bytes = kFp32Bytes;
      ar.shape = {4, 0, 0, 0, 0, 0};
      ar.stream = em.compute_stream();
      ar.phase = tables.phase("optimizer_grad_norm_allreduce");
      prev = b.emit(ar, {n});
    }
    Op adam;
    adam.kind = OpKind::optimizer;
    adam.wall = Wall::memory;
    // Adam with fp32 master weights: read param, grad, m, v (16 B), write param, m, v (12 B) and the
    // bf16 model weight (2 B).
    adam.bytes = shard * 30.0;
    adam.shape = {static_cast<std::int64_t>(shard), 0, 0, 0, 0, 0};
    adam.stream = em.compute_stream();
    adam.phase = tables.phase("optimizer_step");
    prev = b.emit(adam, {prev});
    if (t.use_distributed_optimizer && !t.overlap_param_gather) {
      for (auto it = buckets.rbegin(); it != buckets.rend(); ++it) {
        if (bucket_needs_comm(*it)) b.emit(bucket_op(*it, false), {prev});
      }
    }
  }
  if (has_head) {
    std::uint32_t dep = static_cast<std::uint32_t>(rc.ops.size() - 1);
    if (c.layout.group_size(Group::dp_cp) > 1) {
      Op ar;
      ar.kind = OpKind::collective;
      ar.wall = Wall::communication;
      ar.sub = static_cast<std::uint8_t>(Collective::all_reduce);
      ar.group = Group::dp_cp;
      ar.group_size = static_cast<std::int16_t>(c.layout.group_size(Group::dp_cp));
      ar.bytes = 2 * kFp32Bytes;
      ar.shape = {8, 0, 0, 0, 0, 0};
      ar.stream = em.compute_stream();
      ar.phase = tables.phase("training_metrics_allreduce");
      ar.flags = kMetrics;
      dep = b.emit(ar, {dep});
    }
    Op rd;
    rd.kind = OpKind::host;
    rd.sub = static_cast<std::uint8_t>(HostKind::gpu_read);
    rd.wall = Wall::host;
    rd.bytes = 2 * kFp32Bytes;
    rd.stream = tables.stream("host", StreamKind::host);
    rd.phase = tables.phase("training_metrics_read");
    rd.flags = kMetrics;
    b.emit(rd, {dep});
  }

  // CUDA-graph runs: maximal runs of consecutive ops captured in the same scope.
  for (std::uint32_t i = 0; i < rc.ops.size();) {
    const std::uint8_t g = rc.ops[i].graph;
    std::uint32_t j = i + 1;
    while (j < rc.ops.size() && rc.ops[j].graph == g && g != 0) ++j;
    if (g != 0) rc.graph_runs.push_back({i, j, g});
    i = j;
  }
}

}  // namespace

std::size_t StepGraph::total_ops() const {
  std::size_t n = 0;
  for (const auto& c : classes) n += c.ops.size();
  return n;
}

StepGraph expand_training(const Scenario& s) {
  const Ctx c(s);
  StepGraph g;
  g.step = 0;
  g.step_kind = "train";
  g.layout = c.layout;
  g.tokens = static_cast<double>(s.train->global_batch_size) * s.train->seq_length;
  g.model_flops = megatron_flops_per_iteration(s);
  GraphTables tables(g);
  // Fixed stream order so stream ids are stable across classes.
  tables.stream("compute", StreamKind::compute);

  // Rank classes: pipeline stage x (hot / cold EP rank) x (a slow rank on its own).
  const int world = s.world_size();
  const RoutingModel routing(c.ep, s.train->routing_imbalance);
  std::vector<int> slow_ranks;
  for (const auto& sd : s.cluster.slowdowns) slow_ranks.push_back(sd.rank);
  std::sort(slow_ranks.begin(), slow_ranks.end());
  slow_ranks.erase(std::unique(slow_ranks.begin(), slow_ranks.end()), slow_ranks.end());

  struct Key {
    int stage;
    bool hot;
    int slow;  // rank or -1
    bool operator==(const Key& o) const { return stage == o.stage && hot == o.hot && slow == o.slow; }
  };
  std::vector<Key> keys;
  g.class_of_rank.assign(static_cast<std::size_t>(world), -1);
  for (int r = 0; r < world; ++r) {
    const Coords co = c.layout.coords(r);
    Key k{co.pp, !routing.balanced() && s.model.is_moe() && co.ep == 0,
          std::binary_search(slow_ranks.begin(), slow_ranks.end(), r) ? r : -1};
    auto it = std::find(keys.begin(), keys.end(), k);
    int id = static_cast<int>(it - keys.begin());
    if (it == keys.end()) keys.push_back(k);
    g.class_of_rank[static_cast<std::size_t>(r)] = id;
  }
  g.classes.resize(keys.size());
  for (int r = 0; r < world; ++r) g.classes[static_cast<std::size_t>(g.class_of_rank[static_cast<std::size_t>(r)])].ranks.push_back(r);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto& rc = g.classes[i];
    rc.id = static_cast<int>(i);
    rc.pp_stage = keys[i].stage;
    rc.label = "stage " + std::to_string(keys[i].stage);
    ClassInfo ci;
    ci.stage = keys[i].stage;
    ci.load = 1.0;
    if (!routing.balanced() && s.model.is_moe()) {
      ci.load = routing.load(keys[i].hot ? 0 : 1);
      rc.label += keys[i].hot ? " / hot EP rank" : " / cold EP rank";
    }
    if (keys[i].slow >= 0) rc.label += " / slow rank " + std::to_string(keys[i].slow);
    rc.expert_load = ci.load;
    ci.expert_rows = static_cast<std::int64_t>(std::llround(static_cast<double>(c.Tsp) * c.topk * ci.load)) * c.etp;
    build_class(c, ci, tables, rc);
  }
  return g;
}

}  // namespace threewalls::scenarios

// =============================================================================================
// Inference: a prefill step then decode steps, cycling (step k: position k mod (1 + generate_tokens)).
// =============================================================================================
namespace threewalls::scenarios {
namespace detail {

// Per-layer GPU expert cache with LRU or LFU eviction (ties broken by expert id).
class ExpertCache {
 public:
  ExpertCache(int layers, int capacity, CachePolicy policy)
      : capacity_(capacity), policy_(policy), entries_(static_cast<std::size_t>(layers)) {}

  [[nodiscard]] bool contains(int layer, int expert) const {
    for (const auto& e : entries_[static_cast<std::size_t>(layer)]) {
      if (e.expert == expert) return true;
    }
    return false;
  }

  // Marks `experts` used at time `clock`; misses are inserted, evicting by policy.
  void use(int layer, const std::vector<int>& experts, std::uint64_t clock) {
    auto& es = entries_[static_cast<std::size_t>(layer)];
    for (int x : experts) {
      auto it = std::find_if(es.begin(), es.end(), [&](const Entry& e) { return e.expert == x; });
      if (it != es.end()) {
        it->last_use = clock;
        ++it->uses;
        continue;
      }
      if (capacity_ <= 0) continue;
      if (static_cast<int>(es.size()) >= capacity_) {
        auto victim = std::min_element(es.begin(), es.end(), [&](const Entry& a, const Entry& b) {
          if (policy_ == CachePolicy::lfu && a.uses != b.uses) return a.uses < b.uses;
          if (a.last_use != b.last_use) return a.last_use < b.last_use;
          return a.expert < b.expert;
        });
        // Do not evict an expert used in this same layer visit.
        if (victim->last_use == clock) continue;
        es.erase(victim);
      }
      es.push_back({x, clock, 1});
    }
  }

  // Fills the cache with the first `capacity` experts of every layer (the warm start).
  void warm(int layers) {
    for (int l = 0; l < layers; ++l) {
      auto& es = entries_[static_cast<std::size_t>(l)];
      for (int e = 0; e < capacity_; ++e) es.push_back({e, 0, 0});
    }
  }

 private:
  struct Entry {
    int expert;
    std::uint64_t last_use;
    std::uint64_t uses;
  };
  int capacity_;
  CachePolicy policy_;
  std::vector<std::vector<Entry>> entries_;
};

}  // namespace detail
namespace {

using detail::ExpertCache;

std::vector<int> activated(const std::vector<int>& counts, int first, int count) {
  std::vector<int> out;
  for (int e = first; e < first + count; ++e) {
    if (counts[static_cast<std::size_t>(e)] > 0) out.push_back(e);
  }
  return out;
}

void build_inference_class(const Ctx& c, int ep_rank, const RoutingSampler::StepChoices& choices,
                           const ExpertCache& cache, bool prefill, GraphTables& tables, RankClass& rc) {
  ClassBuilder b(rc);
  ClassInfo ci;
  Emitter em(c, ci, tables, b);
  const auto& m = c.s.model;
  const auto& inf = *c.s.infer;
  const auto& off = inf.expert_offload;
  const bool offload = off.enabled && off.tier != OffloadTier::hbm && m.is_moe();
  const double row_bytes = static_cast<double>(c.h) * kBf16Bytes;
  const std::uint8_t copy0 = tables.stream("copy", StreamKind::copy);
  const std::uint8_t host = tables.stream("host", StreamKind::host);
  const std::uint8_t compute = em.compute_stream();
  for (int l = 0; l < m.num_layers; ++l) rc.layers.push_back(l);

  auto host_op = [&](const std::string& phase, HostKind k, int layer, std::vector<std::uint32_t> deps) {
    Op op;
    op.kind = OpKind::host;
    op.sub = static_cast<std::uint8_t>(k);
    op.wall = Wall::host;
    op.stream = host;
    op.layer = static_cast<std::int16_t>(layer);
    op.phase = tables.phase(phase);
    return b.emit(op, deps.data(), deps.data() + deps.size());
  };

  // Input tokens.
  Op in;
  in.kind = OpKind::copy;
  in.sub = static_cast<std::uint8_t>(CopyKind::h2d_pinned);
  in.wall = Wall::memory;
  in.bytes = static_cast<double>(c.T) * 8;
  in.shape = {static_cast<std::int64_t>(in.bytes), 0, 0, 0, 0, 0};
  in.stream = copy0;
  in.phase = tables.phase("host_to_device");
  in.flags = kDataLoad;
  std::uint32_t input = b.emit(in, {});
  if (c.exec.sync_after_copy) host_op("host_to_device_sync", HostKind::stream_sync, -1, {input});
  input = em.forward(embedding_program(c), -1, -1, -1, input, false, nullptr, false).back();

  const int first_local = ep_rank * c.E_loc;
  // Expert fetches of one layer (for the experts that miss the cache). Returns fetch op per expert.
  const double expert_bytes = (c.swiglu ? 3.0 : 2.0) * static_cast<double>(c.h) * c.ffn_e * kBf16Bytes;
  int copy_rr = 0;
  auto fetch_layer = [&](int layer, const std::vector<int>& experts) {
    std::vector<std::pair<int, std::uint32_t>> out;
    for (int e : experts) {
      if (cache.contains(layer, e)) continue;
      std::uint32_t dep = kNoOp;
      if (off.tier == OffloadTier::nvme) {
        Op d;
        d.kind = OpKind::copy;
        d.sub = static_cast<std::uint8_t>(CopyKind::disk_read);
        d.wall = Wall::memory;
        d.bytes = expert_bytes;
        d.shape = {static_cast<std::int64_t>(expert_bytes), 0, 0, 0, 0, 0};
        d.stream = tables.stream("disk", StreamKind::copy);
        d.layer = static_cast<std::int16_t>(layer);
        d.expert = static_cast<std::int16_t>(e - first_local);  // local index, as the expert ops
        d.phase = tables.phase("expert_fetch_disk");
        dep = b.emit(d, {});
      }
      Op h2d;
      h2d.kind = OpKind::copy;
      h2d.sub = static_cast<std::uint8_t>(CopyKind::h2d_pinned);
      h2d.wall = Wall::memory;
      h2d.bytes = expert_bytes;
      h2d.shape = {static_cast<std::int64_t>(expert_bytes), 0, 0, 0, 0, 0};
      const int s = copy_rr++ % off.copy_streams;
      h2d.stream = s == 0 ? copy0 : tables.stream("copy_" + std::to_string(s), StreamKind::copy);
      h2d.layer = static_cast<std::int16_t>(layer);
      h2d.expert = static_cast<std::int16_t>(e - first_local);
      h2d.phase = tables.phase("expert_fetch_h2d");
      std::uint32_t id = b.emit(h2d, {dep});
      if (c.exec.sync_after_copy) {
        Op sy;
        sy.kind = OpKind::host;
        sy.sub = static_cast<std::uint8_t>(HostKind::stream_sync);
        sy.wall = Wall::host;
        sy.stream = host;
        sy.layer = static_cast<std::int16_t>(layer);
        sy.expert = static_cast<std::int16_t>(e - first_local);
        sy.phase = tables.phase("expert_fetch_sync");
        b.emit(sy, {id});
      }
      out.emplace_back(e, id);
    }
    return out;
  };

  std::vector<std::vector<std::pair<int, std::uint32_t>>> fetched(static_cast<std::size_t>(m.num_layers));
  std::vector<bool> fetched_done(static_cast<std::size_t>(m.num_layers), false);
  auto layer_experts = [&](int layer) {
    return activated(choices.tokens_per_expert(layer, c.E), first_local, c.E_loc);
  };
  if (offload && off.prefetch == Prefetch::all_predicted) {
    for (int l = 0; l < m.num_layers; ++l) {
      if (!m.layer_is_moe(l)) continue;
      fetched[static_cast<std::size_t>(l)] = fetch_layer(l, layer_experts(l));
      fetched_done[static_cast<std::size_t>(l)] = true;
    }
  }

  for (int l = 0; l < m.num_layers; ++l) {
    Program attn;
    attention_block(c, attn);
    auto ids = em.forward(attn, l, -1, -1, input, false, nullptr, false);
    input = ids.back();
    if (!m.layer_is_moe(l)) {
      Program mlp;
      mlp.add(norm_op("mlp_norm", c.Tsp, c.h, Module::mlp_norm, {-1}));
      dense_mlp_block(c, mlp, "mlp", c.ffn, Module::mlp, -1, false);
      mlp.add(memory_op(OpKind::elementwise, "mlp_bda", {c.Tsp * c.h, 0, 0, 0, 0, 0}, 3.0 * c.Tsp * row_bytes,
                        3.0 * c.Tsp * row_bytes, Module::mlp));
      input = em.forward(mlp, l, -1, -1, input, false, nullptr, true).back();
      continue;
    }
    // MoE layer with the sampled routing.
    const auto counts = choices.tokens_per_expert(l, c.E);
    const auto act = activated(counts, first_local, c.E_loc);
    rc.experts_activated += static_cast<std::int64_t>(act.size());
    for (int e : act) rc.experts_cache_hits += (!offload || cache.contains(l, e)) ? 1 : 0;
    std::int64_t rows = 0;
    std::int64_t max_rows = 0;
    for (int e : act) {
      rows += counts[static_cast<std::size_t>(e)];
      max_rows = std::max<std::int64_t>(max_rows, counts[static_cast<std::size_t>(e)]);
    }
    Program pre;
    pre.add(norm_op("mlp_norm", c.Tsp, c.h, Module::mlp_norm, {-1}));
    Spec router = gemm(c, "router", c.T, c.E, c.h, Module::router);
    router.dtype = DType::bf16;
    router.tokens = static_cast<std::int32_t>(c.T);
    pre.add(router);
    Spec topk = memory_op(OpKind::softmax_topk, "router_topk", {c.T, c.E, c.topk, 0, 0, 0},
                          static_cast<double>(c.T) * c.E * (kFp32Bytes + kBf16Bytes), 0, Module::router);
    pre.add(topk);
    auto pre_ids = em.forward(pre, l, -1, -1, input, false, nullptr, false);
    const std::uint32_t normed = pre_ids.front();
    std::uint32_t routed = pre_ids.back();
    if (c.exec.sync_routing_stats) host_op("moe_routing_stats_read_fwd", HostKind::gpu_read, l, {routed});
    // Fetches: this layer's (unless prefetched), then the next layer's when prefetching one ahead.
    if (offload && !fetched_done[static_cast<std::size_t>(l)]) {
      fetched[static_cast<std::size_t>(l)] = fetch_layer(l, act);
      fetched_done[static_cast<std::size_t>(l)] = true;
    }
    if (offload && off.prefetch == Prefetch::next_layer) {
      for (int n = l + 1; n < m.num_layers; ++n) {
        if (!m.layer_is_moe(n)) continue;
        if (!fetched_done[static_cast<std::size_t>(n)]) {
          fetched[static_cast<std::size_t>(n)] = fetch_layer(n, layer_experts(n));
          fetched_done[static_cast<std::size_t>(n)] = true;
        }
        break;
      }
    }
    const auto& my_fetches = fetched[static_cast<std::size_t>(l)];
    std::uint32_t barrier = kNoOp;
    if (offload && off.sync == ExpertSync::barrier && !my_fetches.empty()) {
      std::vector<std::uint32_t> deps;
      for (const auto& [e, id] : my_fetches) deps.push_back(id);
      barrier = host_op("expert_wait", HostKind::barrier, l, deps);
    }
    // Permute, dispatch.
    Program moe;
    const bool grouped = c.exec.expert_execution.kind == ExpertExecutionKind::grouped;
    if (grouped || c.ep > 1) {
      moe.add(memory_op(OpKind::permute, "moe_permute", {c.T * c.topk, c.h, 0, 0, 0, 0},
                               2.0 * c.T * c.topk * row_bytes, 0, Module::moe_pre, {-1}));
    }
    if (c.ep > 1) {
      Spec a2a = collective("moe_dispatch", Collective::all_to_all, Group::ep, static_cast<double>(c.T) * c.topk * row_bytes,
                            Role::compute, Module::moe_comm);
      a2a.shape = {static_cast<std::int64_t>(static_cast<double>(c.T) * c.topk * row_bytes), 0, 0, 0, 0, 0};
      moe.add(a2a);
    }
    auto moe_ids = em.forward(moe, l, -1, -1, routed, false, nullptr, false);
    std::uint32_t dispatched = moe_ids.empty() ? routed : moe_ids.back();
    // Experts.
    std::vector<std::uint32_t> outs;
    const std::int64_t fc1_out = c.swiglu ? 2 * c.ffn_e : c.ffn_e;
    auto fetch_of = [&](int e) {
      for (const auto& [x, id] : my_fetches) {
        if (x == e) return id;
      }
      return kNoOp;
    };
    if (grouped && !act.empty()) {
      Spec g1;
      g1.kind = OpKind::grouped_gemm;
      g1.name = "expert_fc1";
      g1.shape = {rows, fc1_out, c.h, static_cast<std::int64_t>(act.size()), max_rows, 0};
      g1.flops = 2.0 * rows * fc1_out * c.h;
      g1.bytes = static_cast<double>(act.size()) * c.h * fc1_out * c.gemm_elt + rows * (c.h + fc1_out) * kBf16Bytes;
      g1.dtype = c.gemm_dtype;
      g1.module = Module::moe_expert;
      g1.tokens = static_cast<std::int32_t>(rows);
      Program ex;
      ex.add([&] { Spec x = g1; x.after = {-1}; return x; }());
      ex.add([&] {
        Spec a = memory_op(OpKind::elementwise, "expert_act", {rows * c.ffn_e, 0, 0, 0, 0, 0},
                           (static_cast<double>(fc1_out) + c.ffn_e) * rows * kBf16Bytes, 0, Module::moe_act);
        a.sub = activation_kind(c);
        return a;
      }());
      Spec g2 = g1;
      g2.name = "expert_fc2";
      g2.shape = {rows, c.h, c.ffn_e, static_cast<std::int64_t>(act.size()), max_rows, 0};
      g2.flops = 2.0 * rows * c.h * c.ffn_e;
      g2.bytes = static_cast<double>(act.size()) * c.h * c.ffn_e * c.gemm_elt + rows * (c.h + c.ffn_e) * kBf16Bytes;
      g2.after = {};
      ex.add(g2);
      auto ex_ids = em.forward(ex, l, -1, -1, dispatched, false, nullptr, false);
      b.add_dep(ex_ids.front(), barrier);
      for (const auto& [e, id] : my_fetches) b.add_dep(ex_ids.front(), id);
      outs.push_back(ex_ids.back());
    } else {
      const int nstreams = c.exec.expert_execution.kind == ExpertExecutionKind::streams ? c.exec.expert_execution.streams : 1;
      int k = 0;
      for (int e : act) {
        const std::int64_t r = counts[static_cast<std::size_t>(e)];
        Program ex;
        auto tag = [&](Spec sp) {
          sp.expert = e - first_local;
          sp.stream_slot = k % nstreams;
          sp.role = sp.stream_slot == 0 ? Role::compute : Role::expert;
          sp.tokens = static_cast<std::int32_t>(r);
          return sp;
        };
        ex.add(tag(memory_op(OpKind::permute, "expert_gather", {r, c.h, 0, 0, 0, 0}, 2.0 * r * row_bytes, 0,
                             Module::moe_expert, {-1})));
        int up = -1;
        if (c.swiglu) {
          ex.add(tag(gemm(c, "expert_gate", r, c.ffn_e, c.h, Module::moe_expert, {0})));
          up = ex.add(tag(gemm(c, "expert_up", r, c.ffn_e, c.h, Module::moe_expert, {0})));
        } else {
          up = ex.add(tag(gemm(c, "expert_fc1", r, c.ffn_e, c.h, Module::moe_expert, {0})));
        }
        ex.add(tag([&] {
          Spec a = memory_op(OpKind::elementwise, "expert_act", {r * c.ffn_e, 0, 0, 0, 0, 0},
                             (static_cast<double>(fc1_out) + c.ffn_e) * r * kBf16Bytes, 0, Module::moe_act,
                             {up - (c.swiglu ? 1 : 0), up});
          a.sub = activation_kind(c);
          return a;
        }()));
        ex.add(tag(gemm(c, c.swiglu ? "expert_down" : "expert_fc2", r, c.h, c.ffn_e, Module::moe_expert)));
        ex.add(tag(memory_op(OpKind::unpermute, "expert_scatter", {r, c.h, 0, 0, 0, 0}, 3.0 * r * row_bytes, 0,
                             Module::moe_expert)));
        auto ex_ids = em.forward(ex, l, -1, -1, dispatched, false, nullptr, false);
        b.add_dep(ex_ids.front(), barrier);
        // The weights are needed by the first GEMM.
        b.add_dep(ex_ids[1], fetch_of(e));
        if (c.swiglu) b.add_dep(ex_ids[2], fetch_of(e));
        outs.push_back(ex_ids.back());
        ++k;
      }
    }
    // Combine, shared experts, residual.
    Program post;
    if (c.ep > 1) {
      Spec a2a = collective("moe_combine", Collective::all_to_all, Group::ep, static_cast<double>(rows) * row_bytes,
                            Role::compute, Module::moe_comm, {-1});
      a2a.shape = {static_cast<std::int64_t>(static_cast<double>(c.T) * c.topk * row_bytes), 0, 0, 0, 0, 0};
      post.add(a2a);
    }
    if (grouped || c.ep > 1) {
      post.add(memory_op(OpKind::unpermute, "moe_unpermute", {c.T * c.topk, c.h, 0, 0, 0, 0},
                         3.0 * c.T * c.topk * row_bytes, 0, Module::moe_post, {post.specs.empty() ? -1 : 0}));
    }
    std::uint32_t moe_out = outs.empty() ? dispatched : outs.back();
    if (!post.specs.empty()) {
      auto post_ids = em.forward(post, l, -1, -1, moe_out, false, nullptr, false);
      for (auto o : outs) b.add_dep(post_ids.front(), o);
      moe_out = post_ids.back();
    }
    std::uint32_t shared_out = kNoOp;
    if (c.ffn_shared > 0) {
      Program sh;
      dense_mlp_block(c, sh, "shared_expert", c.ffn_shared, Module::shared, -1, false);
      shared_out = em.forward(sh, l, -1, -1, normed, false, nullptr, false).back();
    }
    Program bda;
    bda.add(memory_op(OpKind::elementwise, "mlp_bda", {c.T * c.h, 0, 0, 0, 0, 0}, 3.0 * c.T * row_bytes, 0,
                      Module::moe_post, {-1}));
    auto bda_ids = em.forward(bda, l, -1, -1, moe_out, false, nullptr, false);
    for (auto o : outs) b.add_dep(bda_ids.front(), o);
    b.add_dep(bda_ids.front(), shared_out);
    input = bda_ids.back();
  }
  // Output head on each sequence's newest token, sampling, and the host read of the sampled tokens.
  Ctx head_ctx(c.s, c.mbs, 1, 1, false);
  input = em.forward(head_program(head_ctx), -1, -1, -1, input, false, nullptr, false).back();
  host_op("sampled_token_read", HostKind::gpu_read, -1, {input});
  (void)compute;
  (void)prefill;

  for (std::uint32_t i = 0; i < rc.ops.size();) {
    const std::uint8_t g = rc.ops[i].graph;
    std::uint32_t j = i + 1;
    while (j < rc.ops.size() && rc.ops[j].graph == g && g != 0) ++j;
    if (g != 0) rc.graph_runs.push_back({i, j, g});
    i = j;
  }
}


}  // namespace

namespace detail {

// What an inference step depends on from the steps before it: the routing sampler's state, the
// expert cache after every earlier step's activations, and this step's routing choices.
struct InferenceState {
  explicit InferenceState(const Scenario& s)
      : sampler(s),
        cache(s.model.num_layers, s.infer->expert_offload.enabled ? s.infer->expert_offload.cache_experts_per_layer : 0,
              s.infer->expert_offload.policy) {
    cache.warm(s.model.num_layers);
  }

  // Advances to `target` (>= step): the cache takes in each step's activations before the next
  // step's choices are drawn.
  void advance_to(const Scenario& s, int target) {
    const auto& inf = *s.infer;
    const int cycle = 1 + inf.generate_tokens;
    for (int k = step + 1; k <= target; ++k) {
      if (k > 0 && s.model.is_moe()) {
        for (int l = 0; l < s.model.num_layers; ++l) {
          if (!s.model.layer_is_moe(l)) continue;
          cache.use(l, activated(choices.tokens_per_expert(l, s.model.num_experts), 0, s.model.num_experts), clock++);
        }
      }
      const bool prefill = k % cycle == 0;
      const int tokens = prefill ? inf.batch_size * inf.prompt_length : inf.batch_size;
      choices = sampler.next_step(tokens, inf.batch_size, !prefill);
      step = k;
    }
  }

  int step = -1;  // the step whose choices are in `choices`; the cache holds the steps before it
  RoutingSampler sampler;
  ExpertCache cache;
  RoutingSampler::StepChoices choices;
  std::uint64_t clock = 1;
};

}  // namespace detail
namespace {

StepGraph expand_inference(const Scenario& s, int step, const detail::InferenceState& state) {
  const auto& inf = *s.infer;
  const int cycle = 1 + inf.generate_tokens;
  const RoutingSampler::StepChoices& choices = state.choices;
  const ExpertCache& cache = state.cache;
  const int pos = step % cycle;
  const bool prefill = pos == 0;
  const Ctx c(s, inf.batch_size, prefill ? inf.prompt_length : 1,
              prefill ? inf.prompt_length : static_cast<std::int64_t>(inf.prompt_length) + pos, false);
  StepGraph g;
  g.step = step;
  g.varies_per_step = true;
  g.step_kind = prefill ? "prefill" : "decode";
  g.layout = c.layout;
  g.tokens = static_cast<double>(c.T) * c.dp;
  GraphTables tables(g);
  tables.stream("compute", StreamKind::compute);
  const int world = s.world_size();
  g.class_of_rank.assign(static_cast<std::size_t>(world), 0);
  const int nclasses = s.model.is_moe() ? c.ep : 1;
  g.classes.resize(static_cast<std::size_t>(nclasses));
  for (int r = 0; r < world; ++r) {
    const int cls = s.model.is_moe() ? c.layout.coords(r).ep : 0;
    g.class_of_rank[static_cast<std::size_t>(r)] = cls;
    g.classes[static_cast<std::size_t>(cls)].ranks.push_back(r);
  }
  for (int i = 0; i < nclasses; ++i) {
    auto& rc = g.classes[static_cast<std::size_t>(i)];
    rc.id = i;
    rc.label = nclasses > 1 ? "EP rank " + std::to_string(i) : "all ranks";
    build_inference_class(c, i, choices, cache, prefill, tables, rc);
  }
  double flops = 0;
  for (const auto& rc : g.classes) {
    for (const auto& op : rc.ops) flops += op.flops * static_cast<double>(rc.ranks.size());
  }
  g.model_flops = flops;
  return g;
}

}  // namespace

Stepper::Stepper(const Scenario& s)
    : scenario_(s), inference_(s.train ? nullptr : std::make_unique<detail::InferenceState>(s)) {}
Stepper::~Stepper() = default;
Stepper::Stepper(Stepper&&) noexcept = default;
Stepper& Stepper::operator=(Stepper&&) noexcept = default;

StepGraph Stepper::expand(int step) {
  if (!inference_) {
    StepGraph g = expand_training(scenario_);
    g.step = step;
    return g;
  }
  if (inference_->step > step) *inference_ = detail::InferenceState(scenario_);
  inference_->advance_to(scenario_, step);
  return expand_inference(scenario_, step, *inference_);
}

StepGraph expand(const Scenario& s, int step) { return Stepper(s).expand(step); }

}  // namespace threewalls::scenarios
