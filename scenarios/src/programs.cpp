// The layer programs (program.hpp): attention, dense MLP, MoE, embedding and output head.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "program.hpp"
#include "threewalls/core/attention_mask.hpp"

namespace threewalls::scenarios::detail {

Fp8Quant fp8_quant(const Scenario& s, bool training) {
  Fp8Quant q;
  const ExecOptions& e = s.exec();
  if (e.precision != Precision::fp8) return q;
  q.on = true;
  // Scale bytes per element and orientation: blockwise one fp32 per 1 x 128 block (activations and
  // gradients) and per 128 x 128 block (weights); mxfp8 one E8M0 byte per 1 x 32 block. Delayed and
  // tensorwise scaling keep one scale per tensor.
  double act_scale = 0;
  double weight_scale = 0;
  if (e.fp8_recipe == Fp8Recipe::blockwise) {
    act_scale = kFp32Bytes / 128.0;
    weight_scale = kFp32Bytes / (128.0 * 128.0);
  } else if (e.fp8_recipe == Fp8Recipe::mxfp8) {
    act_scale = 1.0 / 32.0;
    weight_scale = 1.0 / 32.0;
  }
  const double orientations = training ? 2.0 : 1.0;  // rowwise, and in training the columnwise copy
  q.cast_bytes = kBf16Bytes + orientations * (1.0 + act_scale);
  const bool tensorwise = e.fp8_recipe == Fp8Recipe::tensorwise;
  q.amax_pass = tensorwise;
  q.tp_amax_reduce = tensorwise && s.parallel.sequence_parallel && s.parallel.tp > 1;
  q.chunk_amax_reduce = training && e.fp8_recipe == Fp8Recipe::delayed;
  if (training) {
    const bool fp8_weights = s.train->fp8_param_gather;
    // Kept in fp8 (fp8_param_gather): the optimizer re-quantizes its shard; each step the columnwise
    // copy is made from the rowwise one (read 1, write 1). Else the bf16 weight is cast once per step.
    q.weight_cast_bytes = fp8_weights ? 2.0 : kBf16Bytes + 2.0 * (1.0 + weight_scale);
    q.weight_amax_pass = tensorwise && !fp8_weights;
    q.fp8_weights = fp8_weights;
  }
  return q;
}

double gemm_bytes(std::int64_t m, std::int64_t n, std::int64_t k, double elt) {
  return (static_cast<double>(m) * k + static_cast<double>(k) * n) * elt + static_cast<double>(m) * n * kBf16Bytes;
}

Spec gemm(const Ctx& c, std::string name, std::int64_t m, std::int64_t n, std::int64_t k, Module mod,
          std::vector<int> after) {
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

Spec memory_op(OpKind kind, std::string name, OpShape shape, double bytes, double bwd_bytes, Module mod,
               std::vector<int> after) {
  Spec sp;
  sp.kind = kind;
  sp.name = std::move(name);
  sp.shape = shape;
  sp.bytes = bytes;
  sp.bwd_bytes = bwd_bytes;
  sp.wall = Wall::memory;
  sp.module = mod;
  sp.bwd = Bwd::same_kind;
  sp.after = std::move(after);
  return sp;
}

Spec norm_op(std::string name, std::int64_t rows, std::int64_t width, Module mod, std::vector<int> after) {
  double fwd = 2.0 * rows * width * kBf16Bytes;  // read x, write y
  double bwd = 3.0 * rows * width * kBf16Bytes;  // read x and dy, write dx
  return memory_op(OpKind::norm, std::move(name), {rows, width, 0, 0, 0, 0}, fwd, bwd, mod, std::move(after));
}

Spec collective(std::string name, Collective kind, Group g, double bytes, Role role, Module mod,
                std::vector<int> after) {
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

namespace {

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
    p.add(collective(name + "_tp_allreduce", Collective::all_reduce, Group::tp,
                     static_cast<double>(c.T) * c.h * kBf16Bytes, tp_role(c), mod));
  }
}

// `window` > 0 (causal only): each query attends to itself and the window - 1 keys before it
// (ModelSpec::attention_window); a decode step's single query then reads only its window of the cache.
Spec attention_spec(const Ctx& c, std::string name, std::int64_t seq_q, std::int64_t seq_kv, bool causal,
                    std::int64_t heads, std::int64_t kv_heads, std::int64_t dqk, std::int64_t dv,
                    std::int64_t window = 0) {
  Spec sp;
  sp.kind = OpKind::attention;
  sp.sub = static_cast<std::uint8_t>(c.s.model.attention_impl);
  sp.name = std::move(name);
  if (!causal && seq_q > 1) window = 0;  // only a causal mask has a window (prefill on a cache: full)
  if (window > 0 && seq_q == 1) {
    seq_kv = std::min(seq_kv, window);  // decode: the window is the whole of what the query sees
    window = 0;
  }
  if (window >= seq_kv) window = 0;  // a window as long as the keys masks nothing more than causality
  sp.shape = {c.mbs, seq_q, seq_kv, heads, dqk, dv, kv_heads, window};
  // Causal: half of the score matrix (Megatron's accounting); QK^T and PV. Windowed: the (query, key)
  // pairs inside the band.
  double pairs = static_cast<double>(seq_q) * seq_kv * (causal ? 0.5 : 1.0);
  if (window > 0) pairs = causal_pairs(seq_q, seq_kv, window);
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

}  // namespace

// ---- attention block ----
void attention_block(const Ctx& c, Program& p, int layer, int input) {
  const auto& m = c.s.model;
  const std::int64_t heads = m.num_attention_heads / c.tp;
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
    if (m.qk_layernorm) p.add(norm_op("attn_qk_norm", c.T * (heads + kv_heads), dqk, Module::attn_proj_in, {}));
  }
  // Rotary position embedding (fused): reads and writes the rotated part of the queries and keys
  // (MLA: the decoupled rotary dims of every query head and the one shared rotary key), forward and
  // backward (the gradient rotated back); cos and sin are cached.
  const bool rope = m.position_embedding_type == PositionEmbedding::rope;
  if (rope) {
    const std::int64_t rotated =
        m.attention == AttentionKind::mla ? c.T * (heads + 1) * m.qk_pos_emb_head_dim : c.T * (heads + kv_heads) * dqk;
    const double bytes = 2.0 * static_cast<double>(rotated) * kBf16Bytes;
    const int last = static_cast<int>(p.specs.size()) - 1;
    std::vector<int> after = {last};
    if (m.attention == AttentionKind::mla) after = {last - 1, last};  // the query and key/value up-projections
    Spec sp = memory_op(OpKind::elementwise, "attn_rope", {rotated, 0, 0, 0, 0, 0}, bytes, bytes, Module::attn_proj_in,
                        std::move(after));
    sp.sub = static_cast<std::uint8_t>(ElementwiseKind::copy);
    p.add(sp);
  }
  // Core attention. The q/k/v producers are the ops added since the norm; the core op depends on
  // all of them (they are on the compute stream except nothing else, so the last one is enough).
  int qkv_last = static_cast<int>(p.specs.size()) - 1;
  std::vector<int> qkv_producers = {qkv_last};
  if (m.attention == AttentionKind::mla && !rope) qkv_producers = {qkv_last - 1, qkv_last};
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
    const std::int64_t window = m.attention_window(layer);
    Spec core = attention_spec(c, "attn_core", c.seq, c.seq_kv, c.causal, heads, kv_heads, dqk, dv, window);
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
                        static_cast<double>(Tloc) * c.E * (kFp32Bytes + kBf16Bytes),
                        static_cast<double>(Tloc) * c.E * 3 * kFp32Bytes, Module::router);
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
  const std::int64_t routed_rows = Tloc * c.topk;                            // rows this rank sends
  const std::int64_t recv_rows = std::max<std::int64_t>(1, ci.expert_rows);  // rows its experts process
  const bool per_expert = c.exec.expert_execution.kind != ExpertExecutionKind::grouped;
  // Hugging Face's loop (sequential, streams:N) gathers each expert's rows itself; grouped and split
  // experts read rows permuted into expert order.
  const bool hf_loop = per_expert && c.exec.expert_execution.kind != ExpertExecutionKind::split;
  // A per-expert mode's rows of local expert e, and a spec of expert e on stream slot `slot` (slot 0:
  // the compute stream).
  auto rows_of = [&](int e) -> std::int64_t { return recv_rows / c.E_loc + (e < recv_rows % c.E_loc ? 1 : 0); };
  auto on_expert = [&](Spec sp, int e, int slot) {
    sp.expert = e;
    sp.stream_slot = slot;
    sp.role = slot == 0 ? Role::compute : Role::expert;
    sp.tokens = static_cast<std::int32_t>(rows_of(e));
    return sp;
  };
  const Dispatcher disp = c.exec.token_dispatcher;
  const double row_bytes = static_cast<double>(c.h) * kBf16Bytes;
  // The alltoall dispatcher permutes the routed rows into expert order and unpermutes them after the
  // combine, but for Hugging Face's loop on one EP rank, which gathers each expert's rows itself and
  // scatter-adds them back.
  const bool alltoall_permutes = disp == Dispatcher::alltoall && !(hf_loop && c.ep == 1);
  // Where the router weights are applied, once per routed row: by a moe_unpermute after the experts
  // (allgather; alltoall where it permutes; flex before its combine, at ep > 1), else by the loop's
  // per-expert scatter.
  const bool unpermutes = disp == Dispatcher::allgather || alltoall_permutes || (disp == Dispatcher::flex && c.ep > 1);

  int shared_input = norm;
  int dispatched = -1;
  // Permute (gather rows into expert order) before the dispatch.
  if (disp == Dispatcher::allgather) {
    if (c.ep > 1) {
      p.add(collective("moe_dispatch", Collective::all_gather, Group::ep, static_cast<double>(Tloc) * c.ep * row_bytes,
                       Role::compute, Module::moe_comm, {topk_id}));
      p.specs.back().tokens = static_cast<std::int32_t>(Tloc * c.ep);
    }
    Spec perm = memory_op(OpKind::permute, "moe_permute", {recv_rows, c.h, Tloc * c.ep, 0, 0, 0},
                          2.0 * recv_rows * row_bytes, 2.0 * recv_rows * row_bytes, Module::moe_pre);
    perm.tokens = static_cast<std::int32_t>(recv_rows);
    dispatched = p.add(perm);
  } else {
    dispatched = topk_id;
    if (alltoall_permutes) {
      Spec perm = memory_op(OpKind::permute, "moe_permute", {routed_rows, c.h, Tloc, 0, 0, 0},
                            2.0 * routed_rows * row_bytes, 2.0 * routed_rows * row_bytes, Module::moe_pre, {topk_id});
      perm.tokens = static_cast<std::int32_t>(routed_rows);
      dispatched = p.add(perm);
    }
    if (c.ep > 1) {
      Spec a2a = collective("moe_dispatch", Collective::all_to_all, Group::ep,
                            static_cast<double>(routed_rows) * row_bytes, Role::compute, Module::moe_comm);
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
      // Flex: the dispatch delivers each token once per destination rank; Megatron's flex dispatcher
      // then permutes the received tokens into expert order, one row per (token, local expert) pair
      // (DeepEP backend: get_permuted_hidden_states_by_experts; HybridEP: the permute kernel of
      // dispatch_with_permute). A kernel of its own, on the rows the experts process.
      if (disp == Dispatcher::flex) {
        const std::int64_t rows = recv_rows / c.etp;
        Spec perm = memory_op(OpKind::permute, "moe_permute", {rows, c.h, 0, 0, 0, 0}, 2.0 * rows * row_bytes,
                              2.0 * rows * row_bytes, Module::moe_pre);
        perm.tokens = static_cast<std::int32_t>(rows);
        dispatched = p.add(perm);
      }
    }
    if (c.etp > 1) {
      Spec ag = collective("moe_etp_allgather", Collective::all_gather, Group::etp,
                           static_cast<double>(recv_rows) * row_bytes, Role::compute, Module::moe_comm);
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
  } else if (!hf_loop) {
    // split:N, Transformer Engine's GroupedLinear with its multi-stream cuBLAS backend
    // (nvte_multi_tensor_gemm): the permuted rows split per expert without a copy, one GEMM per expert
    // (fc1 with gate and up fused) round-robin over N streams, one activation kernel over all rows
    // between the two projections.
    const int nstreams = c.exec.expert_execution.streams;
    auto tag = [&](Spec sp, int e) { return on_expert(std::move(sp), e, e % nstreams); };
    std::vector<int> fc1s;
    for (int e = 0; e < c.E_loc; ++e) {
      fc1s.push_back(p.add(tag(gemm(c, "expert_fc1", rows_of(e), fc1_out, c.h, Module::moe_expert, {dispatched}), e)));
    }
    Spec act = memory_op(OpKind::elementwise, "expert_act", {recv_rows * c.ffn_e, 0, 0, 0, 0, 0},
                         (static_cast<double>(fc1_out) + c.ffn_e) * recv_rows * kBf16Bytes,
                         (2.0 * fc1_out + c.ffn_e) * recv_rows * kBf16Bytes, Module::moe_act, fc1s);
    act.tokens = static_cast<std::int32_t>(recv_rows);
    act.sub = activation_kind(c);
    const int a = p.add(act);
    for (int e = 0; e < c.E_loc; ++e) {
      expert_outputs.push_back(p.add(tag(gemm(c, "expert_fc2", rows_of(e), c.h, c.ffn_e, Module::moe_expert, {a}), e)));
    }
  } else {
    const int nstreams =
        c.exec.expert_execution.kind == ExpertExecutionKind::streams ? c.exec.expert_execution.streams : 1;
    // A PyTorch eager loop over the local experts of one EP rank (Hugging Face's MoE blocks) finds each
    // expert's rows with torch.where of its routing mask: a device-to-host read per expert, which waits
    // for everything queued before it on the expert's stream (its slot's previous op).
    const bool rows_read = c.s.run.framework == Framework::pytorch_eager && c.ep == 1;
    std::vector<int> slot_last(static_cast<std::size_t>(nstreams), dispatched);
    for (int e = 0; e < c.E_loc; ++e) {
      const std::int64_t rows = rows_of(e);
      const int slot = e % nstreams;
      auto tag = [&](Spec sp) { return on_expert(std::move(sp), e, slot); };
      std::vector<int> gather_after = {dispatched};
      if (rows_read) {
        Spec read;
        read.kind = OpKind::host;
        read.name = "expert_rows_read";
        read.sub = static_cast<std::uint8_t>(HostKind::gpu_read);
        read.wall = Wall::host;
        read.bytes = 8.0;
        read.module = Module::host;
        read.bwd = Bwd::none;
        read.expert = e;
        read.after = {slot_last[static_cast<std::size_t>(slot)]};
        gather_after.push_back(p.add(read));
      }
      int g = p.add(tag(memory_op(OpKind::permute, "expert_gather", {rows, c.h, Tloc, 0, 0, 0}, 2.0 * rows * row_bytes,
                                  2.0 * rows * row_bytes, Module::moe_expert, gather_after)));
      int up = -1;
      if (c.swiglu) {
        p.add(tag(gemm(c, "expert_gate", rows, c.ffn_e, c.h, Module::moe_expert, {g})));
        up = p.add(tag(gemm(c, "expert_up", rows, c.ffn_e, c.h, Module::moe_expert, {g})));
      } else {
        up = p.add(tag(gemm(c, "expert_fc1", rows, c.ffn_e, c.h, Module::moe_expert, {g})));
      }
      Spec act =
          memory_op(OpKind::elementwise, "expert_act", {rows * c.ffn_e, 0, 0, 0, 0, 0},
                    (static_cast<double>(fc1_out) + c.ffn_e) * rows * kBf16Bytes,
                    (2.0 * fc1_out + c.ffn_e) * rows * kBf16Bytes, Module::moe_act, {up - (c.swiglu ? 1 : 0), up});
      act.sub = activation_kind(c);
      p.add(tag(act));
      p.add(tag(gemm(c, c.swiglu ? "expert_down" : "expert_fc2", rows, c.h, c.ffn_e, Module::moe_expert)));
      Spec scatter = memory_op(OpKind::unpermute, "expert_scatter", {rows, c.h, Tloc, 0, 0, 0}, 3.0 * rows * row_bytes,
                               2.0 * rows * row_bytes, Module::moe_expert);
      scatter.sub = static_cast<std::uint8_t>(unpermutes ? RowWeights::unweighted : RowWeights::weighted);
      int sc = p.add(tag(std::move(scatter)));
      expert_outputs.push_back(sc);
      slot_last[static_cast<std::size_t>(slot)] = sc;
    }
  }
  // Combine.
  int combined = -1;
  std::vector<int> combined_set;
  if (disp == Dispatcher::allgather) {
    Spec unperm = memory_op(OpKind::unpermute, "moe_unpermute", {recv_rows, c.h, Tloc * c.ep, 0, 0, 0},
                            3.0 * recv_rows * row_bytes, 2.0 * recv_rows * row_bytes, Module::moe_post, expert_outputs);
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
      // Flex: the inverse before the combine, summing each token's expert rows weighted by their
      // routing probabilities (reads the rows and the probabilities, writes one row per received token).
      if (disp == Dispatcher::flex) {
        const std::int64_t rows = recv_rows / c.etp;
        Spec unperm = memory_op(OpKind::unpermute, "moe_unpermute", {rows, c.h, 0, 0, 0, 0}, 3.0 * rows * row_bytes,
                                2.0 * rows * row_bytes, Module::moe_post, after);
        unperm.tokens = static_cast<std::int32_t>(rows);
        last = p.add(unperm);
        after = {last};
      }
      Spec a2a =
          collective("moe_combine", Collective::all_to_all, Group::ep,
                     static_cast<double>(routed_rows) * row_bytes * ci.load, Role::compute, Module::moe_comm, after);
      a2a.shape = {static_cast<std::int64_t>(routed_rows * row_bytes), 2, 0, 0, 0, 0};
      a2a.tokens = static_cast<std::int32_t>(recv_rows / c.etp);
      last = p.add(a2a);
      after = {last};
    }
    if (alltoall_permutes) {
      Spec unperm = memory_op(OpKind::unpermute, "moe_unpermute", {routed_rows, c.h, Tloc, 0, 0, 0},
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

// ---- multi-token prediction (Megatron-Core's MultiTokenPredictionLayer) ----
// Before a depth's transformer layer: the shared embedding of the tokens shifted by the depth, a norm
// of it and one of the hidden state coming in (the program's input), and eh_proj, the column-parallel
// projection of their concatenation back to the hidden size, gathered over tp (and split again over
// the sequence with sequence parallelism, which moves nothing). Returns the op the layer reads.
int mtp_prologue(const Ctx& c, Program& p) {
  for (Spec s : embedding_program(c).specs) {  // p is empty: the embedding's indices stay valid
    s.name = "mtp_" + s.name;
    p.add(std::move(s));
  }
  const int emb = static_cast<int>(p.specs.size()) - 1;
  const int enorm = p.add(norm_op("mtp_enorm", c.Tsp, c.h, Module::attn_norm, {emb}));
  const int hnorm = p.add(norm_op("mtp_hnorm", c.Tsp, c.h, Module::attn_norm, {-1}));
  std::vector<int> proj_in = {enorm, hnorm};
  if (c.tp > 1 && c.sp) {
    proj_in = {p.add(collective("mtp_eh_sp_allgather", Collective::all_gather, Group::tp,
                                static_cast<double>(c.T) * 2 * c.h * kBf16Bytes, tp_role(c), Module::attn_proj_in,
                                {enorm, hnorm}))};
  }
  int out = p.add(gemm(c, "mtp_eh_proj", c.T, c.h / c.tp, 2 * c.h, Module::attn_proj_in, proj_in));
  if (c.tp > 1) {
    out = p.add(collective("mtp_eh_proj_tp_allgather", Collective::all_gather, Group::tp,
                           static_cast<double>(c.T) * c.h * kBf16Bytes, tp_role(c), Module::attn_proj_in));
  }
  return out;
}

// After a depth's transformer layer: its final norm and the shared output head with the depth's loss
// (the head program's ops, named mtp_*).
void mtp_epilogue(const Ctx& c, Program& p) {
  const int base = static_cast<int>(p.specs.size());
  for (Spec s : head_program(c).specs) {
    s.name = "mtp_" + s.name;
    for (int& a : s.after) a = a < 0 ? base - 1 : a + base;
    p.specs.push_back(std::move(s));
  }
}

Program layer_program(const Ctx& outer, const ClassInfo& ci, int layer) {
  // A layer first_last_layers_bf16 keeps in bf16: its GEMMs on the bf16 families, no fp8 casts.
  const bool bf16_layer = outer.quant.on && outer.train && outer.train->layer_in_bf16(layer, outer.s.model.num_layers);
  Ctx bf16 = outer;
  if (bf16_layer) {
    bf16.gemm_elt = kBf16Bytes;
    bf16.gemm_dtype = DType::bf16;
    bf16.quant = Fp8Quant{};
  }
  const Ctx& c = bf16_layer ? bf16 : outer;
  Program p;
  const bool mtp = c.s.model.is_mtp_layer(layer);
  attention_block(c, p, layer, mtp ? mtp_prologue(c, p) : -1);
  const int attn_out = static_cast<int>(p.specs.size()) - 1;
  if (c.s.model.layer_is_moe(layer)) {
    moe_block(c, ci, p, attn_out);
  } else {
    p.add(norm_op("mlp_norm", c.Tsp, c.h, Module::mlp_norm, {attn_out}));
    dense_mlp_block(c, p, "mlp", c.ffn, Module::mlp, -1, false);
    p.add(memory_op(OpKind::elementwise, "mlp_bda", {c.Tsp * c.h, 0, 0, 0, 0, 0}, 3.0 * c.Tsp * c.h * kBf16Bytes,
                    3.0 * c.Tsp * c.h * kBf16Bytes, Module::mlp));
  }
  if (mtp) mtp_epilogue(c, p);
  return p;
}

std::array<std::vector<bool>, kFineGrainedNodes> fine_grained_nodes(const Program& p) {
  const std::size_t n = p.specs.size();
  std::array<std::vector<bool>, kFineGrainedNodes> nodes;
  for (auto& m : nodes) m.assign(n, false);
  std::size_t dispatch = n;
  std::size_t combine = n;
  for (std::size_t i = 0; i < n; ++i) {
    if (p.specs[i].name == "moe_dispatch" && dispatch == n) dispatch = i;
    if (p.specs[i].name == "moe_combine" && combine == n) combine = i;
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t node = 0;
    if (dispatch < n && i >= dispatch) {
      if (i == dispatch)
        node = 1;
      else if (combine < n && i >= combine && p.specs[i].module == Module::head)
        node = 4;
      else if (combine < n && i >= combine && p.specs[i].module != Module::shared)
        node = 3;
      else
        node = 2;
    }
    nodes[node][i] = true;
  }
  return nodes;
}

Program embedding_program(const Ctx& c) {
  Program p;
  Spec emb = memory_op(OpKind::embedding, "embedding", {c.T, c.h, c.vocab / c.tp, 0, 0, 0},
                       2.0 * c.T * c.h * kBf16Bytes + c.T * 8.0, 2.0 * c.T * c.h * kFp32Bytes, Module::embedding, {-1});
  p.add(emb);
  if (c.tp > 1) {
    if (c.sp) {
      p.add(collective("embedding_sp_reducescatter", Collective::reduce_scatter, Group::tp,
                       static_cast<double>(c.T) * c.h * kBf16Bytes, Role::compute, Module::embedding));
    } else {
      p.add(collective("embedding_tp_allreduce", Collective::all_reduce, Group::tp,
                       static_cast<double>(c.T) * c.h * kBf16Bytes, Role::compute, Module::embedding));
    }
  }
  return p;
}

Program head_program(const Ctx& c) {
  Program p;
  p.add(norm_op("final_norm", c.Tsp, c.h, Module::head, {-1}));
  if (c.tp > 1 && c.sp) {
    p.add(collective("lm_head_sp_allgather", Collective::all_gather, Group::tp,
                     static_cast<double>(c.T) * c.h * kBf16Bytes, Role::compute, Module::head));
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

}  // namespace threewalls::scenarios::detail
