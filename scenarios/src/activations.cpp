// What a layer saves for its backward: docs/memory_model.md, "Activations of one layer".
#include "threewalls/scenarios/activations.hpp"

#include "threewalls/scenarios/parameters.hpp"

namespace threewalls::scenarios {

double tokens_per_microbatch(const Scenario& s) {
  if (s.train) return static_cast<double>(s.train->micro_batch_size) * s.train->seq_length / s.parallel.cp;
  return static_cast<double>(s.infer->batch_size) * s.infer->prompt_length;
}

double residual_bytes(const Scenario& s) {
  const double t = s.parallel.tp;
  const double rep = s.parallel.sequence_parallel ? t : 1.0;
  return 2.0 * tokens_per_microbatch(s) * s.model.hidden_size / rep;
}

double layer_activation_bytes(const Scenario& s, int layer, double expert_load, const ActivationOptions& opt,
                              bool apply_selective) {
  // docs/memory_model.md, "Activations of one layer". T tokens of one micro-batch on this rank
  // (before sequence parallelism), 2-byte activations; `rep` divides tensors outside the TP region
  // (sequence parallel), t those inside it.
  const ModelSpec& m = s.model;
  const ModelDims d = model_dims(m);
  const double t = s.parallel.tp;
  const double rep = s.parallel.sequence_parallel ? t : 1.0;
  double T = 0.0;
  double seq = 0.0;
  if (s.train) {
    T = static_cast<double>(s.train->micro_batch_size) * s.train->seq_length / s.parallel.cp;
    seq = static_cast<double>(s.train->seq_length) / s.parallel.cp;
  } else {
    T = static_cast<double>(s.infer->batch_size) * s.infer->prompt_length;
    seq = s.infer->prompt_length;
  }
  auto sel = [&](const char* module) { return apply_selective && s.train && s.train->recompute_module(module); };
  // An fp8 GEMM (Transformer Engine) saves its input as the fp8 columnwise copy its weight gradient
  // reads (1 byte) instead of the bf16 tensor (2); a tensor another op also keeps in bf16 (the
  // attention output, which the attention backward reads) keeps both.
  const bool fp8 = s.train && s.exec().precision == Precision::fp8;
  const double gemm_in = fp8 ? 1.0 : 2.0;
  const double extra_copy = fp8 ? 1.0 : 0.0;
  const double drop = opt.dropout ? 1.0 : 0.0;
  const bool ln_recompute = sel("layernorm");
  double bytes = 0.0;

  // Attention block.
  bytes += 2.0 * T * d.h / rep;                     // input norm's input (the residual)
  if (!ln_recompute) bytes += gemm_in * T * d.h / rep;  // norm output = QKV / down-projection input
  const double heads = d.a / t;
  double core_in = 0.0;  // Q, K, V kept for the attention backward
  double core_out_width = 0.0;
  if (d.mla) {
    if (d.q_lora > 0) {
      bytes += 2.0 * T * d.q_lora / rep;                     // compressed query (q norm input)
      if (!ln_recompute) bytes += gemm_in * T * d.q_lora / rep;  // q norm output = W_UQ input
    }
    bytes += 2.0 * T * (d.kv_lora + d.drope) / rep;                // compressed kv + rope key (kv norm input)
    if (!ln_recompute) bytes += gemm_in * T * d.kv_lora / rep;     // kv norm output = W_UKV input
    core_in = 2.0 * T * heads * (2.0 * (d.dqk + d.drope) + d.dv);  // up-projected Q, K, V
    if (sel("mla_up_proj")) core_in = 0.0;                         // recomputed from the latents
    core_out_width = heads * d.dv;
  } else {
    core_in = 2.0 * T * (heads * d.dh + 2.0 * (d.g / t) * d.dh);  // Q, K, V
    if (m.qk_layernorm) bytes += 2.0 * T * (heads + d.g / t) * d.dh;  // the Q and K norms' inputs
    core_out_width = heads * d.dh;
  }
  bytes += core_in;
  if (!sel("core_attn")) {
    if (opt.fused_attention) {
      bytes += 4.0 * T * heads;  // log-sum-exp (fp32) per head and query
    } else {
      bytes += 5.0 * heads * seq * T;  // softmax output 2, dropout mask 1, dropout output 2
    }
  }
  bytes += (2.0 + extra_copy) * T * core_out_width;  // attention output = output projection input
  bytes += drop * T * d.h / rep;      // attention dropout mask

  // MLP block.
  bytes += 2.0 * T * d.h / rep;  // MLP norm's input
  const bool moe = m.layer_is_moe(layer);
  const bool whole_moe = moe && sel("moe");
  const bool mlp_norm_recompute = ln_recompute || whole_moe;
  // norm output = the dense fc1's input (fp8 with fp8 GEMMs), or the router's (bf16)
  if (!mlp_norm_recompute) bytes += (moe ? 2.0 : gemm_in) * T * d.h / rep;
  if (!moe) {
    if (!sel("mlp")) {
      bytes += 2.0 * T * d.f * d.act_in / t;  // activation input
      bytes += gemm_in * T * d.f / t;         // activation output = fc2 input
    }
  } else if (!whole_moe) {
    const double tokens = T / rep;                                    // tokens entering the MoE layer on this rank
    bytes += 4.0 * tokens * d.E;                                      // router logits (fp32)
    const double rows = tokens * d.k * expert_load * s.parallel.etp;  // routed rows for the local experts
    const double width = d.fe / s.parallel.etp;
    bytes += gemm_in * rows * d.h;                         // permuted tokens = expert fc1 input
    bytes += 2.0 * rows * width * d.act_in;                // activation input
    if (!sel("moe_act")) bytes += gemm_in * rows * width;  // activation output = expert fc2 input
    bytes += 2.0 * rows * d.h;                         // expert output = unpermute input
    if (d.fs > 0 && !sel("shared_experts")) {
      bytes += 2.0 * T * d.fs * d.act_in / t;
      bytes += gemm_in * T * d.fs / t;  // activation output = shared fc2 input
    }
  }
  bytes += drop * T * d.h / rep;  // MLP dropout mask
  if (m.is_mtp_layer(layer)) {
    // A multi-token-prediction depth: the embedding norm's and hidden norm's inputs, eh_proj's input
    // (their concatenation), and what the output head keeps (final norm, head input, fp32 logits).
    bytes += 2.0 * 2.0 * T * d.h / rep + gemm_in * T * 2.0 * d.h / rep;
    bytes += head_activation_bytes(s);
  }
  return bytes;
}

double embedding_activation_bytes(const Scenario& s, const ActivationOptions& opt) {
  const double resid = residual_bytes(s);
  return resid + (opt.dropout ? resid / 2.0 : 0.0);
}

double head_activation_bytes(const Scenario& s) {
  const double V = static_cast<double>(s.model.padded_vocab_size(s.parallel.tp));
  return 2.0 * residual_bytes(s) + 4.0 * tokens_per_microbatch(s) * V / s.parallel.tp;
}

}  // namespace threewalls::scenarios
