#include "threewalls/scenarios/parameters.hpp"

#include <algorithm>
#include <utility>

namespace threewalls::scenarios {
namespace {

// Attention parameters of one layer: {replicated over TP, sharded over TP}.
std::pair<double, double> attention_params(const ModelDims& d) {
  if (d.mla) {
    double repl = d.norm;  // input norm
    double shard = 0.0;
    if (d.q_lora > 0) {
      repl += d.h * d.q_lora + d.q_lora;            // W_DQ, q norm (RMSNorm)
      shard += d.q_lora * d.a * (d.dqk + d.drope);  // W_UQ
    } else {
      shard += d.h * d.a * (d.dqk + d.drope);  // W_Q
    }
    repl += d.h * (d.kv_lora + d.drope) + d.kv_lora;  // W_DKV, kv norm
    shard += d.kv_lora * d.a * (d.dqk + d.dv);        // W_UKV
    shard += d.a * d.dv * d.h;                        // W_O
    return {repl, shard};
  }
  const double shard = d.h * d.a * d.dh + 2.0 * d.h * d.g * d.dh + d.a * d.dh * d.h;  // Q, K, V, O
  return {d.norm + d.qk_norm, shard};  // the query and key norms are per head: replicated
}

}  // namespace

ModelDims model_dims(const ModelSpec& m) {
  ModelDims d{};
  d.h = m.hidden_size;
  d.a = m.num_attention_heads;
  d.g = m.num_query_groups > 0 ? m.num_query_groups : m.num_attention_heads;
  d.dh = m.kv_channels > 0 ? m.kv_channels : (m.num_attention_heads > 0 ? d.h / d.a : 0.0);
  d.f = m.ffn_hidden_size;
  d.fe = m.moe_ffn_hidden_size;
  d.fs = m.moe_shared_expert_intermediate_size;
  d.E = m.num_experts;
  d.k = m.moe_router_topk;
  d.q_lora = m.q_lora_rank;
  d.kv_lora = m.kv_lora_rank;
  d.dqk = m.qk_head_dim;
  d.drope = m.qk_pos_emb_head_dim;
  d.dv = m.v_head_dim;
  d.mult = m.swiglu ? 3.0 : 2.0;
  d.act_in = m.swiglu ? 2.0 : 1.0;
  d.norm = m.normalization == Normalization::layernorm ? 2.0 * d.h : d.h;
  d.qk_norm = m.qk_layernorm ? (m.normalization == Normalization::layernorm ? 4.0 : 2.0) * d.dh : 0.0;
  d.mla = m.attention == AttentionKind::mla;
  return d;
}

double model_parameters(const ModelSpec& m) {
  const ModelDims d = model_dims(m);
  const auto [arepl, ashard] = attention_params(d);
  double total = 0.0;
  for (int l = 0; l < m.num_layers + m.mtp_num_layers; ++l) {
    total += arepl + ashard + d.norm;  // attention, MLP norm
    if (m.is_mtp_layer(l)) total += 2.0 * d.h * d.h + 3.0 * d.norm;  // eh_proj; enorm, hnorm, final norm
    if (m.layer_is_moe(l)) {
      total += d.h * d.E + d.E * d.mult * d.h * d.fe + d.mult * d.h * d.fs;
    } else {
      total += d.mult * d.h * d.f;
    }
  }
  const double emb = static_cast<double>(m.vocab_size) * d.h;
  total += emb + d.norm;  // embedding, final norm
  if (m.untie_embeddings_and_output_weights) total += emb;
  return total;
}

double active_parameters(const ModelSpec& m) {
  const ModelDims d = model_dims(m);
  double idle = 0.0;  // routed experts a token does not pass through
  for (int l = 0; l < m.num_layers + m.mtp_num_layers; ++l) {
    if (m.layer_is_moe(l)) idle += (d.E - d.k) * d.mult * d.h * d.fe;
  }
  return model_parameters(m) - idle;
}

ParameterCount layer_parameters(const Scenario& s, int layer) {
  const ModelSpec& m = s.model;
  const ModelDims d = model_dims(m);
  const double t = s.parallel.tp;
  const auto [arepl, ashard] = attention_params(d);
  ParameterCount p;
  p.dense = arepl + ashard / t + d.norm;
  if (m.is_mtp_layer(layer)) p.dense += 2.0 * d.h * d.h / t + 3.0 * d.norm;  // eh_proj; enorm, hnorm, final norm
  if (m.layer_is_moe(layer)) {
    p.dense += d.h * d.E + d.mult * d.h * d.fs / t;  // router (replicated), shared experts
    p.expert = (d.E / s.parallel.ep) * d.mult * d.h * d.fe / s.parallel.etp;
  } else {
    p.dense += d.mult * d.h * d.f / t;
  }
  return p;
}

double embedding_parameters(const Scenario& s) {
  return static_cast<double>(s.model.padded_vocab_size(s.parallel.tp)) * s.model.hidden_size / s.parallel.tp;
}

double head_parameters(const Scenario& s, bool first_stage) {
  const double norm = model_dims(s.model).norm;
  const bool output_layer = s.model.untie_embeddings_and_output_weights || !first_stage;
  return norm + (output_layer ? embedding_parameters(s) : 0.0);
}

ParameterCount rank_parameters(const Scenario& s, const std::vector<int>& layers, bool first_stage, bool last_stage) {
  ParameterCount p;
  for (int l : layers) {
    const ParameterCount lp = layer_parameters(s, l);
    p.dense += lp.dense;
    p.expert += lp.expert;
  }
  if (first_stage) p.dense += embedding_parameters(s);
  if (last_stage) p.dense += head_parameters(s, first_stage);
  if (holds_mtp_embedding_copy(s, layers, first_stage)) p.dense += embedding_parameters(s);
  return p;
}

bool holds_mtp_embedding_copy(const Scenario& s, const std::vector<int>& layers, bool first_stage) {
  return !first_stage && std::any_of(layers.begin(), layers.end(), [&](int l) { return s.model.is_mtp_layer(l); });
}

double fsdp_gathered_parameters(const Scenario& s, const std::vector<int>& layers, bool first_stage, bool last_stage) {
  if (!s.train || !s.train->shards_gradients()) return 0.0;
  const TrainSpec& t = *s.train;
  double unit = 0.0;
  for (int l : layers) unit = std::max(unit, layer_parameters(s, l).total());
  int layers_per_pass = 1;
  if (t.recompute_granularity == RecomputeGranularity::full && t.recompute_method == RecomputeMethod::uniform) {
    layers_per_pass = std::max(1, std::min(t.recompute_num_layers, static_cast<int>(layers.size())));
  }
  unit *= layers_per_pass;
  if (first_stage) unit = std::max(unit, embedding_parameters(s));
  if (last_stage) unit = std::max(unit, head_parameters(s, first_stage));
  const int chains = t.overlap_moe_expert_parallel_comm ? 2 : 1;
  return static_cast<double>(kFsdpPassesPerChain * chains) * unit;
}

double inference_weight_bytes(const Scenario& s, const std::vector<int>& layers, bool first_stage, bool last_stage) {
  const InferSpec& inf = *s.infer;
  const double wbytes = inf.exec.precision == Precision::fp8 ? 1.0 : 2.0;
  const ParameterCount held = rank_parameters(s, layers, first_stage, last_stage);
  double expert = held.expert;
  if (inf.expert_offload.enabled && inf.expert_offload.tier != OffloadTier::hbm && s.model.is_moe()) {
    // Only the expert cache lives in HBM.
    const ModelDims d = model_dims(s.model);
    int moe_layers = 0;
    for (int l : layers) moe_layers += s.model.layer_is_moe(l) ? 1 : 0;
    const double per_expert = d.mult * d.h * d.fe / s.parallel.etp;
    const double local = d.E / s.parallel.ep;
    expert = moe_layers * std::min(local, static_cast<double>(inf.expert_offload.cache_experts_per_layer)) * per_expert;
  }
  return wbytes * (held.dense + expert);
}

double kv_cache_bytes_per_layer(const Scenario& s) {
  const InferSpec& inf = *s.infer;
  const double kv_bytes = inf.kv_cache_precision == Precision::fp8 ? 1.0 : 2.0;
  const ModelDims d = model_dims(s.model);
  const double per_token = d.mla ? (d.kv_lora + d.drope) : 2.0 * (d.g / s.parallel.tp) * d.dh;
  const double positions = static_cast<double>(inf.prompt_length) + inf.generate_tokens;
  return inf.batch_size * positions * per_token * kv_bytes;
}

double attention_kv_bytes(const Op& op) {
  const auto& a = op.shape;
  return 2.0 * static_cast<double>(a[0]) * static_cast<double>(attention_kv_heads(op)) * static_cast<double>(a[2]) *
         static_cast<double>(a[4] + a[5]);
}

bool reads_kv_cache(const Op& op, double kv_cache_bytes_per_layer) {
  return op.kind == OpKind::attention && attention_kernel(op) == AttentionKernel::decode &&
         attention_kv_bytes(op) <= kv_cache_bytes_per_layer;
}

bool works_on_parameter_state(const Op& op) {
  if ((op.flags & kParameterState) != 0) return true;
  switch (op.kind) {
    case OpKind::optimizer: return true;
    case OpKind::elementwise: return op.elementwise_kind() == ElementwiseKind::reduce;
    case OpKind::collective:
      switch (op.group) {
        case Group::dp:
        case Group::dp_cp:
        case Group::edp:
        case Group::embedding:
        case Group::world: return op.collective() != Collective::all_to_all;
        default: return false;
      }
    default: return false;
  }
}

double moment_bytes(MomentDtype d) {
  switch (d) {
    case MomentDtype::fp32: return 4.0;
    case MomentDtype::bf16:
    case MomentDtype::fp16: return 2.0;
    case MomentDtype::fp8: return 1.0;
  }
  return 4.0;
}

ParameterBytes parameter_bytes(const TrainSpec& t) {
  ParameterBytes b;
  b.weight = t.fp8_param_gather ? 1.0 : 2.0;
  b.gradient = t.grad_reduce_in_fp32 ? 4.0 : 2.0;
  b.exp_avg = moment_bytes(t.exp_avg_dtype);
  b.exp_avg_sq = moment_bytes(t.exp_avg_sq_dtype);
  return b;
}

ParameterStateBytes training_parameter_state(const Scenario& s, const Layout& layout, const std::vector<int>& layers,
                                             bool first_stage, bool last_stage) {
  const TrainSpec& tr = *s.train;
  const ParameterCount held = rank_parameters(s, layers, first_stage, last_stage);
  // Dense parameters are sharded over dp x cp, routed experts over the expert data-parallel group.
  const double shard = held.dense / layout.group_size(Group::dp_cp) + held.expert / layout.group_size(Group::edp);
  // Megatron-FSDP: the gathered units' weights and gradients are live beside the shard.
  const double gathered = tr.shards_gradients() || tr.shards_parameters()
                              ? fsdp_gathered_parameters(s, layers, first_stage, last_stage)
                              : 0.0;
  const ParameterBytes per = parameter_bytes(tr);
  ParameterStateBytes b;
  b.weights = per.weight * (tr.shards_parameters() ? shard + gathered : held.total());
  b.gradients = per.gradient * (tr.shards_gradients() ? shard + gathered : held.total());
  // A PyTorch program with master weights holds autograd's bf16 gradients of every parameter beside
  // the main-gradient buffers until its main_grad_copy (training.cpp) after the backward.
  constexpr double kAutogradGradientBytes = 2.0;  // bf16, as the model weights
  if (s.run.framework == Framework::pytorch_eager) b.gradients += kAutogradGradientBytes * held.total();
  b.shard = tr.shards_optimizer_state() ? shard : held.total();
  b.optimizer = per.optimizer() * b.shard;
  return b;
}

}  // namespace threewalls::scenarios
