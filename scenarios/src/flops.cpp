// Megatron-LM's FLOPs per iteration (megatron/training/training.py, num_floating_point_operations,
// as of Megatron-Core 0.12-0.14, and Megatron-Bridge's flop_utils.py, which adds the multi-token
// prediction depths), transcribed term by term for the model shapes threewalls supports (no hybrid
// Mamba layers). Model FLOPs: forward, dgrad and wgrad of every GEMM (the 3x) and causal attention
// counted as half the score matrix (a sliding-window layer as Megatron-Bridge counts it, below); no recomputation, no
// router; norms only as the MTP term counts them. An MTP depth counts as one more layer of the last layer's kind, plus
// its norms and eh_proj, plus one more pass through the output layer.
#include "threewalls/scenarios/step_graph.hpp"

#include <algorithm>
#include <cmath>

namespace threewalls::scenarios {

double megatron_flops_per_iteration(const Scenario& s) {
  if (!s.train) return 0.0;
  const auto& m = s.model;
  const double batch = s.train->global_batch_size;
  const double seq = s.train->seq_length;
  const double h = m.hidden_size;
  const double mtp = m.mtp_num_layers;
  const double layers = m.num_layers + mtp;
  const double num_moe = m.num_moe_layers() + (m.layer_is_moe(m.num_layers - 1) ? mtp : 0.0);
  const double num_dense = layers - num_moe;
  const double experts_routed_to = m.is_moe() ? m.moe_router_topk : 0.0;
  const double moe_ffn = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : m.ffn_hidden_size;
  const double shared_ffn = m.moe_shared_expert_intermediate_size;
  const double gated = m.swiglu ? 1.5 : 1.0;
  const double expansion = 3.0 * 2.0 * 2.0;
  const double heads = m.num_attention_heads;
  // Keys per query the core attention counts, summed over the layers: seq / 2 (causal, half the score
  // matrix) for a full-attention layer; for a sliding-window layer of w < seq keys Megatron-Bridge's
  // exact causal mean w - w (w - 1) / (2 seq) (flop_utils.py, "Exact average causal SWA context").
  double context = 0.0;
  for (int l = 0; l < m.num_layers + m.mtp_num_layers; ++l) {
    const double w = m.attention_window(l);
    context += w > 0 && w < seq ? w - w * (w - 1.0) / (2.0 * seq) : seq / 2.0;
  }
  double self_attn = 0.0;
  if (m.attention == AttentionKind::mla) {
    const double qk = m.qk_head_dim;
    const double rope = m.qk_pos_emb_head_dim;
    const double v = m.v_head_dim;
    const double q_term = m.q_lora_rank == 0 ? h * heads * (qk + rope)
                                             : m.q_lora_rank * (h + heads * (qk + rope) + 1);
    self_attn = 3.0 * 2.0 *
                (layers * (q_term + m.kv_lora_rank * (h + heads * (qk + v) + 1) + h * rope + heads * v * h) +
                 context * (heads * (qk + rope) + heads * v));
  } else {
    const double query_projection = static_cast<double>(m.kv_channels) * heads;
    const double ratio = query_projection / h;
    self_attn =
        expansion * h * h * ratio * (layers * (1.0 + static_cast<double>(m.num_query_groups) / heads) + context / h);
  }
  const double vocab = static_cast<double>(m.padded_vocab_size(s.parallel.tp));
  const double mlp = expansion * layers * h *
                     (m.ffn_hidden_size * gated * (num_dense / layers) +
                      moe_ffn * experts_routed_to * gated * (num_moe / layers) + shared_ffn * gated * (num_moe / layers));
  const double logits = 3.0 * 2.0 * h * vocab * (1.0 + mtp);
  const double mtp_norms_and_proj = 3.0 * 2.0 * mtp * (3.0 * h + 2.0 * h * h);
  return batch * seq * (mlp + self_attn + logits + mtp_norms_and_proj);
}

double sm_fraction(const Op& op, int sm_count) {
  if (sm_count <= 0) return 1.0;
  const auto& s = op.shape;
  auto ceil_div = [](double a, double b) { return std::ceil(a / b); };
  double blocks = 1.0;
  switch (op.kind) {
    case OpKind::gemm:
      blocks = ceil_div(static_cast<double>(std::max<std::int64_t>(s[0], 1)), 128.0) *
               ceil_div(static_cast<double>(std::max<std::int64_t>(s[1], 1)), 128.0) *
               static_cast<double>(std::max<std::int64_t>(s[3], 1));
      break;
    case OpKind::grouped_gemm:
      blocks = ceil_div(static_cast<double>(std::max<std::int64_t>(s[0], 1)), 128.0) *
               ceil_div(static_cast<double>(std::max<std::int64_t>(s[1], 1)), 128.0);
      break;
    case OpKind::attention:
      blocks = static_cast<double>(std::max<std::int64_t>(s[0], 1) * std::max<std::int64_t>(s[3], 1)) *
               ceil_div(static_cast<double>(std::max<std::int64_t>(s[1], 1)), 128.0);
      break;
    default: blocks = ceil_div(std::max(op.bytes, 1.0), 65536.0); break;
  }
  return std::clamp(blocks / sm_count, 1.0 / sm_count, 1.0);
}

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::gemm: return "gemm";
    case OpKind::grouped_gemm: return "grouped_gemm";
    case OpKind::attention: return "attention";
    case OpKind::elementwise: return "elementwise";
    case OpKind::norm: return "norm";
    case OpKind::softmax_topk: return "softmax_topk";
    case OpKind::permute: return "permute";
    case OpKind::unpermute: return "unpermute";
    case OpKind::embedding: return "embedding";
    case OpKind::cross_entropy: return "cross_entropy";
    case OpKind::optimizer: return "optimizer";
    case OpKind::copy: return "copy";
    case OpKind::collective: return "collective";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
    case OpKind::host: return "host";
  }
  return "?";
}

const char* to_string(HostKind h) {
  switch (h) {
    case HostKind::stream_sync: return "stream_sync";
    case HostKind::gpu_read: return "gpu_read";
    case HostKind::framework: return "framework";
    case HostKind::barrier: return "barrier";
    case HostKind::graph_launch: return "graph_launch";
  }
  return "?";
}

const char* to_string(ElementwiseKind e) {
  switch (e) {
    case ElementwiseKind::add: return "add";
    case ElementwiseKind::copy: return "copy";
    case ElementwiseKind::swiglu: return "swiglu";
    case ElementwiseKind::swiglu_bwd: return "swiglu_bwd";
    case ElementwiseKind::gelu: return "gelu";
    case ElementwiseKind::gelu_bwd: return "gelu_bwd";
    case ElementwiseKind::reduce: return "reduce";
    case ElementwiseKind::quantize: return "quantize";
    case ElementwiseKind::amax: return "amax";
  }
  return "?";
}

const char* to_string(StreamKind s) {
  switch (s) {
    case StreamKind::compute: return "compute";
    case StreamKind::communication: return "communication";
    case StreamKind::copy: return "copy";
    case StreamKind::host: return "host";
  }
  return "?";
}

}  // namespace threewalls::scenarios
