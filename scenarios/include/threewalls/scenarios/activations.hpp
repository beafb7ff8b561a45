#pragma once
// What a layer saves for its backward: the bytes of the tensors one layer keeps from its forward until
// its backward, for one micro-batch on one rank, under the scenario's parallelism and selective
// recomputation (docs/memory_model.md, "Activations of one layer"; Korthikanti et al. 2022). The one
// owner of this rule: the simulator's memory model and the backend's saved activations both use it.
#include "threewalls/scenarios/scenario.hpp"

namespace threewalls::scenarios {

// Modelling choices that the scenario language does not express.
struct ActivationOptions {
  // Fused (flash) attention keeps the output and the log-sum-exp instead of the s x s scores,
  // softmax and dropout tensors (Megatron-Core with Transformer Engine). false = the unfused
  // attention of Korthikanti et al. (5 a s^2 b bytes per layer).
  bool fused_attention = true;
  // Dropout masks (1 byte per element) after attention and MLP. Modern MoE recipes train without
  // dropout; the paper's GPT had it.
  bool dropout = false;
};

// Tokens of one micro-batch on one rank before sequence parallelism: micro-batch x sequence / cp
// (training), batch x prompt (inference).
double tokens_per_microbatch(const Scenario& s);

// Bytes of one micro-batch's tokens entering a layer (the residual stream, bf16) on one rank: what
// full recomputation keeps of a layer (or of a group of layers).
double residual_bytes(const Scenario& s);

// Stored activations of one layer for one micro-batch on one rank, bytes. `expert_load` scales the
// routed-token tensors of an MoE layer (1 = balanced). Full recomputation is not applied here (it
// keeps residual_bytes per recomputed group instead).
double layer_activation_bytes(const Scenario& s, int layer, double expert_load, const ActivationOptions& opt,
                              bool apply_selective_recompute = true);

// What the first pipeline stage keeps per micro-batch outside its layers: the embedding output (and
// its dropout mask); and the last stage: the final norm's input, the output layer's input and the fp32
// logits.
double embedding_activation_bytes(const Scenario& s, const ActivationOptions& opt);
double head_activation_bytes(const Scenario& s);

}  // namespace threewalls::scenarios
