#pragma once
// Programs: one layer (or the embedding, or the output head) described as a small DAG of op specs
// with data edges, its *forward program*. The training class instantiates each program's forward,
// recompute and backward ops per micro-batch (Emitter, emit.hpp), so forward and backward always
// mirror each other; an inference step instantiates forwards only. docs/stepgraph.md describes the
// ops, their phase names, shapes, FLOPs and bytes; programs.cpp is the reference.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "threewalls/scenarios/layout.hpp"
#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/scenarios/stages.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::scenarios::detail {

inline constexpr double kBf16Bytes = 2.0;
inline constexpr double kFp32Bytes = 4.0;

// What part of the model an op belongs to: drives recomputation and CUDA-graph scopes.
enum class Module : std::uint8_t {
  attn_norm,
  attn_proj_in,  // QKV (or MLA down projections)
  mla_up,        // MLA up projections
  attn_core,
  attn_out,  // output projection, TP collectives, residual
  mlp_norm,
  mlp,  // dense MLP
  router,
  moe_pre,     // permute before dispatch
  moe_comm,    // dispatch/combine
  moe_expert,  // expert GEMMs
  moe_act,     // expert activation
  moe_post,    // unpermute after combine
  shared,      // shared experts
  host,        // host ops
  embedding,
  head,
};

enum class Role : std::uint8_t { compute, tp_comm, cp_comm, shared, expert };

// How an op is mirrored in the backward pass.
// same_kind: the backward op keeps the forward op's kind with kBackward set, and a kind's backward is
// that op's own gradient (a permute's backward is the scatter-sum of its rows back to the tokens, an
// unpermute's the row gather with the router weights' gradient: backend::permute_bwd /
// unpermute_bwd, PyTorch's index_select and index_add_ backwards).
enum class Bwd : std::uint8_t { gemm, grouped, attention, same_kind, collective, none };

struct Spec {
  OpKind kind = OpKind::gemm;
  std::string name;  // phase base name; suffixes _fwd, _dgrad, _wgrad, _bwd, _recompute are added
  OpShape shape{};
  double flops = 0;
  double bytes = 0;
  double bwd_bytes = 0;  // bytes of the backward op (same_kind)
  Wall wall = Wall::compute;
  std::uint8_t sub = 0;
  Group group = Group::none;
  DType dtype = DType::bf16;
  Role role = Role::compute;
  int expert = -1;
  int stream_slot = 0;     // expert streams: 0 = compute, k = expert_k
  std::vector<int> after;  // producers in the program; -1 = the program's input
  Module module = Module::attn_norm;
  Bwd bwd = Bwd::same_kind;
  std::int32_t tokens = -1;
  std::uint8_t flags = 0;
};

// The fp8 quantisation work of a recipe (docs/stepgraph.md, "FP8 quantisation"): what every fp8
// GEMM pays besides its GEMM. Bytes are per element of the bf16 tensor cast (read 2, write the fp8
// copy 1, in training the columnwise copy 1 more, plus the recipe's scales).
struct Fp8Quant {
  bool on = false;                 // precision = fp8: the fp8 GEMMs cast their operands
  double cast_bytes = 0;           // per element of an activation (forward) or output gradient (backward)
  bool amax_pass = false;          // tensorwise: an amax pass (read 2 bytes per element) before each cast
  bool tp_amax_reduce = false;     // tensorwise with sequence parallelism: the amax of a tensor gathered
                                   // over tp (a column-parallel input, a row-parallel output gradient) is
                                   // all-reduced over tp before the cast
  bool chunk_amax_reduce = false;  // delayed: the amaxes of a model chunk's forward and of its backward are
                                   // all-reduced once per pass (dp_cp; Megatron's amax group is tp x dp x cp)
  double weight_cast_bytes = 0;    // per weight element, once per step at the chunk's first micro-batch
  bool fp8_weights = false;        // fp8_param_gather: the weight cast is the fp8 weight's transpose
  bool weight_amax_pass = false;   // tensorwise without fp8 weights: an amax pass over the bf16 weight
};
Fp8Quant fp8_quant(const Scenario& s, bool training);

// Derived quantities shared by every class of a scenario (for one step).
struct Ctx {
  const Scenario& s;
  const Layout layout;
  int tp, cp, pp, vpp, dp, ep, etp, edp;
  bool sp;
  int mbs;              // sequences per micro-batch (training) or decode batch (inference)
  int seq;              // query tokens per sequence in this step
  std::int64_t seq_kv;  // keys per sequence (= seq in training and prefill)
  int num_mb;
  bool training;
  bool causal;
  std::int64_t h;
  std::int64_t T;      // tokens of one micro-batch on a rank after the CP split
  std::int64_t Tsp;    // rows in sequence-parallel regions
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
  Fp8Quant quant;

  // Training step.
  explicit Ctx(const Scenario& sc)
      : Ctx(sc, sc.train->micro_batch_size, sc.train->seq_length, sc.train->seq_length, true) {
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
        shared_overlap(sc.train && sc.train->moe_shared_expert_overlap), stages(sc), quant(fp8_quant(sc, is_training)) {
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

// A program: the forward ops of one layer (or of the embedding / output head), as a DAG.
struct Program {
  std::vector<Spec> specs;
  // The phase ids of each spec's ops (0xFFFF: not yet interned), for the StepGraph whose GraphTables
  // has serial `phase_tables`: slots 0 to 4 by phase name suffix (Emitter::phase_of), then those of
  // its FP8 quantisation ops (Emitter::quant_phase: operand x direction x kind of op). A program's
  // specs do not change once emitted.
  static constexpr std::size_t kSuffixSlots = 5;
  static constexpr std::size_t kQuantSlots = 27;
  mutable std::vector<std::array<std::uint16_t, kSuffixSlots + kQuantSlots>> phase_ids;
  mutable std::uint64_t phase_tables = 0;
  int add(Spec s) {
    if (s.after.empty()) s.after.push_back(static_cast<int>(specs.size()) - 1);  // previous op (or input)
    specs.push_back(std::move(s));
    return static_cast<int>(specs.size()) - 1;
  }
};

// ---- op specs ----
// Bytes of an m x n x k GEMM: both inputs at `elt` bytes per element, the output in bf16.
double gemm_bytes(std::int64_t m, std::int64_t n, std::int64_t k, double elt);
Spec gemm(const Ctx& c, std::string name, std::int64_t m, std::int64_t n, std::int64_t k, Module mod,
          std::vector<int> after = {});
Spec memory_op(OpKind kind, std::string name, OpShape shape, double bytes, double bwd_bytes, Module mod,
               std::vector<int> after = {});
Spec norm_op(std::string name, std::int64_t rows, std::int64_t width, Module mod, std::vector<int> after = {});
Spec collective(std::string name, Collective kind, Group g, double bytes, Role role, Module mod,
                std::vector<int> after = {});
std::uint8_t activation_kind(const Ctx& c);

// ---- blocks and programs ----
// Attention: norm, projections (MHA/GQA or MLA), the KV-cache append (inference), core attention
// (with the context-parallel ring), output projection, TP collectives, residual. `input` is the op the
// block reads (-1: the program's input).
void attention_block(const Ctx& c, Program& p, int layer, int input = -1);
// A dense MLP (or the shared experts): fc1, activation, fc2 with their TP collectives.
void dense_mlp_block(const Ctx& c, Program& p, const std::string& prefix, std::int64_t ffn, Module mod, int input_op,
                     bool own_norm);
// An MoE MLP: router, permute and dispatch, routed experts (grouped or per expert), combine, shared
// experts, residual.
void moe_block(const Ctx& c, const ClassInfo& ci, Program& p, int layer_input);
// A layer's program; a multi-token-prediction depth (layer >= num_layers) adds its embedding, norms and
// eh_proj before the layer and its final norm, output head and loss after it.
Program layer_program(const Ctx& c, const ClassInfo& ci, int layer);
// The nodes of a layer program in Megatron's fine-grained (combined 1F1B) schedule, as masks over its
// specs: attention (everything before the token dispatch, the router and permute included), dispatch
// (the dispatch all-to-all), experts (everything between dispatch and combine, and the shared experts),
// combine (the combine all-to-all and what follows it in the layer) and post-process (a
// multi-token-prediction depth's final norm, output head and loss: Megatron's post-process node, on the
// computation stream). A layer without a dispatch is one attention node.
inline constexpr std::size_t kFineGrainedNodes = 5;
std::array<std::vector<bool>, kFineGrainedNodes> fine_grained_nodes(const Program& p);
Program embedding_program(const Ctx& c);
Program head_program(const Ctx& c);

}  // namespace threewalls::scenarios::detail
