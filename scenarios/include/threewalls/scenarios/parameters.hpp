#pragma once
// Parameter counts: of the whole model, and of the shard one rank holds. The expansion (gradient
// buckets, the optimizer step) and the memory model (weights, gradients, optimizer state) both count
// through these functions. The formulas are in docs/memory_model.md ("Parameters").
#include <vector>

#include "threewalls/scenarios/layout.hpp"
#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::scenarios {

// Parameters held by one rank.
struct ParameterCount {
  double dense = 0.0;   // reduced over dp x cp
  double expert = 0.0;  // reduced over edp
  [[nodiscard]] double total() const { return dense + expert; }
};

// A model's dimensions as doubles, in the symbols of docs/memory_model.md: the counting formulas of
// the parameters here and of the memory model's activations read them.
struct ModelDims {
  double h, a, g, dh, f, fe, fs, E,
      k;  // hidden, heads, query groups, head dim, FFN, expert FFN, shared FFN, experts, top-k
  double q_lora, kv_lora, dqk, drope, dv;  // MLA
  double mult;                             // weight matrices per MLP: 3 (SwiGLU) or 2
  double act_in;                           // activation-function input width factor: 2 (SwiGLU: gate and up) or 1
  double norm;                             // parameters per norm: h (RMSNorm) or 2h (LayerNorm)
  double qk_norm;                          // the query and key norms' (qk_layernorm): 2 dh or 4 dh; 0
  bool mla;
};
ModelDims model_dims(const ModelSpec& m);

// Whole-model parameter count (no parallelism): embedding, layers, output layer.
double model_parameters(const ModelSpec& m);
// Parameters one token passes through: model_parameters with moe_router_topk of the num_experts
// routed experts of each MoE layer (shared experts, router, embedding and output layer included).
double active_parameters(const ModelSpec& m);
// One rank's share of layer `layer`: dense = attention, both norms, the dense MLP or the router and
// shared experts (TP-sharded where Megatron-Core shards them); expert = the rank's routed experts
// (num_experts / ep of them, each sharded over etp).
ParameterCount layer_parameters(const Scenario& s, int layer);
// One rank's shard of the embedding (the padded vocabulary split over TP), on the first stage.
double embedding_parameters(const Scenario& s);
// One rank's share of the last stage's head: the final norm, and the output layer (untied) or the
// last stage's copy of the tied embedding (none when the last stage is also the first).
double head_parameters(const Scenario& s, bool first_stage);
// Whether the stage holding `layers` keeps its own copy of the word embedding for multi-token
// prediction: it runs an MTP depth and is not the first stage (the copy's gradient is all-reduced with
// the first stage's in the embedding group).
bool holds_mtp_embedding_copy(const Scenario& s, const std::vector<int>& layers, bool first_stage);
// Parameters of one rank of the pipeline stage holding `layers` (global indices), with the embedding
// on the first stage, the head on the last and the MTP embedding copy where it is held.
ParameterCount rank_parameters(const Scenario& s, const std::vector<int>& layers, bool first_stage, bool last_stage);

// Megatron-FSDP with sharded gradients (and parameters): parameters whose full gradients (and gathered
// weights) are live at once on one rank of the stage holding `layers`. A chain of FSDP passes (forward and backward
// passes over a unit: a layer, the embedding or the head; over a whole checkpoint group with full uniform recompute)
// keeps kFsdpPassesPerChain passes gathered; the combined 1F1B schedule runs two chains. The largest unit counts for
// each.
inline constexpr int kFsdpPassesPerChain = 2;
double fsdp_gathered_parameters(const Scenario& s, const std::vector<int>& layers, bool first_stage, bool last_stage);

// Device bytes of one training rank's parameter state, as Megatron-Core holds it with bf16 parameters:
// Weights, gradients (the main_grad buffer that gradient-accumulation fusion writes and the gradient
// reduction reads) and Adam's master weights and moments, at parameter_bytes each, each sharded as the
// scenario shards it (distributed optimizer, Megatron-FSDP). The memory model charges
// these bytes and the backend allocates them (docs/memory_model.md, "Weights, gradients, optimizer state").
// Bytes per parameter of each part of a training rank's parameter state, from the scenario's precision
// keys. Megatron's defaults: bf16 model weights, a gradient buffer accumulated and reduced in fp32, Adam
// with fp32 master weights and moments (2 + 4 + 12). Everything that sizes or moves the parameter state
// takes its bytes from here: the memory model, the backend, the expansion's data-parallel collectives,
// gradient norm and optimizer step, and the planner.
struct ParameterBytes {
  double weight = 2.0;      // model weights (1 with train.fp8_param_gather)
  double gradient = 4.0;    // gradient buffer, as reduced (2 with train.grad_reduce_in_fp32 = false)
  double master = 4.0;      // the optimizer's fp32 main parameters
  double exp_avg = 4.0;     // Adam's first moment (train.exp_avg_dtype)
  double exp_avg_sq = 4.0;  // Adam's second moment (train.exp_avg_sq_dtype)
  [[nodiscard]] double optimizer() const { return master + exp_avg + exp_avg_sq; }
  // Adam's memory traffic per shard parameter: it reads the master weight, the gradient and both
  // moments, and writes the master weight, both moments and the model weight (30 bytes by default).
  [[nodiscard]] double adam_traffic() const { return 2.0 * optimizer() + gradient + weight; }
};
[[nodiscard]] ParameterBytes parameter_bytes(const TrainSpec& t);
[[nodiscard]] double moment_bytes(MomentDtype d);

struct ParameterStateBytes {
  double weights = 0.0;
  double gradients = 0.0;
  double optimizer = 0.0;
  double shard = 0.0;  // parameters of this rank's optimizer shard (what the Adam step updates)
};
// Ops of a training step that work on the parameter state rather than on activations: the optimizer
// step, the gradient norm (an element-wise reduce), and the collectives of the data-parallel side
// (gradient reductions and parameter gathers on dp, dp_cp, edp and the embedding group; the norm's
// all-reduce over the world). Megatron-Core runs them in place on its parameter and gradient buffers,
// so they need no operand buffers of their own: the memory model leaves them out of "the largest op"
// and the backend runs them on its parameter state.
[[nodiscard]] bool works_on_parameter_state(const Op& op);
// Inference (`s` has an [infer] section): bytes of one rank's resident weights (1 byte per parameter
// with fp8 precision, else 2; with expert offloading beyond HBM, only the expert cache's experts) and of
// one layer's KV cache at the longest context (prompt and generated tokens; MLA caches its compressed
// latent and rope key, fp8 caches 1 byte per value). The memory model charges these bytes and the
// backend holds them (docs/memory_model.md, "Inference").
double inference_weight_bytes(const Scenario& s, const std::vector<int>& layers, bool first_stage, bool last_stage);
double kv_cache_bytes_per_layer(const Scenario& s);
// Bytes of the keys and values an attention op reads (bf16).
[[nodiscard]] double attention_kv_bytes(const Op& op);
// A decode attention op reads its keys and values from the KV cache when they fit one layer's share of
// it: with GQA and MHA they are the cache; MLA's up-projected keys and values are larger than its
// compressed cache and come from operand buffers.
[[nodiscard]] bool reads_kv_cache(const Op& op, double kv_cache_bytes_per_layer);
// `s` must have a [train] section; `layers`, `first_stage` and `last_stage` as for rank_parameters.
ParameterStateBytes training_parameter_state(const Scenario& s, const Layout& layout, const std::vector<int>& layers,
                                             bool first_stage, bool last_stage);

}  // namespace threewalls::scenarios
