// Model tables that the tests of several libraries write into their inline scenarios: the keys of a
// [model] table, one a line, each line ended, without the table's header or name.
#pragma once

#include <string>

namespace threewalls::test {

// OLMoE-1B-7B's layer shape (hidden 2048, 16 heads of 128, 64 experts of FFN 1024, top-8, vocabulary
// 50304; as in scenarios/examples/small_moe_*.toml) with `num_layers` layers.
inline std::string olmoe_model_keys(int num_layers) {
  return "num_layers = " + std::to_string(num_layers) + R"(
hidden_size = 2048
num_attention_heads = 16
kv_channels = 128
vocab_size = 50304
num_experts = 64
moe_ffn_hidden_size = 1024
moe_router_topk = 8
)";
}

// A small MoE for layouts of up to 8 GPUs: 4 layers, hidden 1024, 8 heads, 8 experts of FFN 512,
// top-2, vocabulary 32000.
inline std::string small_moe_model_keys() {
  return R"(num_layers = 4
hidden_size = 1024
num_attention_heads = 8
vocab_size = 32000
num_experts = 8
moe_ffn_hidden_size = 512
moe_router_topk = 2
)";
}

}  // namespace threewalls::test
