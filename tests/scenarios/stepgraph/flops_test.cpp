#include <gtest/gtest.h>

#include <cmath>

#include "test_util.hpp"
#include "threewalls/scenarios/step_graph.hpp"

using namespace threewalls;
using namespace threewalls::scenarios;

namespace {

double graph_model_flops(const StepGraph& g) {
  double f = 0;
  for (const auto& rc : g.classes) {
    for (const auto& op : rc.ops) {
      if (!(op.flags & kRecompute)) f += op.flops * static_cast<double>(rc.ranks.size());
    }
  }
  return f;
}

}  // namespace

// Narayanan et al. 2021 (Megatron-LM, SC'21) give 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) for a GPT with
// a 4h MLP; the current Megatron formula halves the causal score term: s/(12h) instead of s/(6h).
TEST(MegatronFlops, MatchesTheClosedFormForGpt3) {
  Scenario s = test::scenario_from(R"(schema_version = 1
[model]
num_layers = 96
hidden_size = 12288
ffn_hidden_size = 49152
num_attention_heads = 96
vocab_size = 51200
swiglu = false
[parallel]
tp = 8
pp = 8
[train]
micro_batch_size = 1
global_batch_size = 1536
seq_length = 2048
[cluster]
gpu = "h100"
gpus_per_node = 8
nodes = 16
)");
  const double B = 1536, S = 2048, L = 96, H = 12288, V = 51200;  // 51200 is a multiple of 128 x 8
  const double expected = 72.0 * B * S * L * H * H * (1.0 + S / (12.0 * H) + V / (12.0 * L * H));
  EXPECT_NEAR(megatron_flops_per_iteration(s) / expected, 1.0, 1e-12);
}

TEST(MegatronFlops, StepGraphTotalAgreesWithinOnePercentForEveryTrainingExample) {
  for (const auto& path : test::example_scenarios()) {
    Scenario s = load_scenario(path);
    if (!s.train) continue;
    SCOPED_TRACE(path.string());
    StepGraph g = expand(s);
    const double formula = megatron_flops_per_iteration(s);
    ASSERT_GT(formula, 0);
    EXPECT_NEAR(graph_model_flops(g) / formula, 1.0, 0.01);
  }
}

TEST(MegatronFlops, DenseGqaAndMlaLayersAgree) {
  // GQA with SwiGLU, tp = 2, cp = 2, pp = 2 (every term of the attention formula in play).
  Scenario gqa = test::scenario_from(R"(schema_version = 1
[model]
num_layers = 8
hidden_size = 4096
ffn_hidden_size = 14336
num_attention_heads = 32
attention = "gqa"
num_query_groups = 8
vocab_size = 128256
[parallel]
tp = 2
cp = 2
pp = 2
[train]
micro_batch_size = 1
global_batch_size = 16
seq_length = 8192
[cluster]
gpu = "h100"
gpus_per_node = 8
nodes = 2
)");
  EXPECT_NEAR(graph_model_flops(expand(gqa)) / megatron_flops_per_iteration(gqa), 1.0, 0.01);
  // MLA without query compression (DeepSeek-V2-Lite-like), MoE with a shared expert.
  Scenario mla = test::scenario_from(R"(schema_version = 1
[model]
num_layers = 4
hidden_size = 2048
ffn_hidden_size = 10944
num_attention_heads = 16
attention = "mla"
kv_lora_rank = 512
qk_head_dim = 128
qk_pos_emb_head_dim = 64
v_head_dim = 128
vocab_size = 102400
num_experts = 64
moe_ffn_hidden_size = 1408
moe_router_topk = 6
moe_shared_expert_intermediate_size = 2816
first_dense_layers = 1
[parallel]
ep = 4
[train]
micro_batch_size = 2
global_batch_size = 8
seq_length = 4096
[cluster]
gpu = "h100"
gpus_per_node = 4
nodes = 1
)");
  EXPECT_NEAR(graph_model_flops(expand(mla)) / megatron_flops_per_iteration(mla), 1.0, 0.01);
  Scenario mtp = mla;  // two multi-token-prediction depths after the last (MoE) layer
  mtp.model.mtp_num_layers = 2;
  EXPECT_NEAR(graph_model_flops(expand(mtp)) / megatron_flops_per_iteration(mtp), 1.0, 0.01);
}

// Megatron-Bridge's flop_utils.py with mtp_num_layers: each depth adds a layer of the last layer's
// kind, 3h + 2h^2 per token (its norms and eh_proj) and one more pass through the output layer, all
// times 3 x 2 (forward, dgrad, wgrad; multiply-add = 2). Written out for DeepSeek-V3 (MLA, MoE last
// layer); DenseGqaAndMlaLayersAgree checks the StepGraph's ops of MTP depths against the formula.
TEST(MegatronFlops, MultiTokenPredictionDepthAddsALayerItsProjectionAndAHeadPass) {
  Scenario s = load_scenario(test::source_dir() / "scenarios" / "examples" / "deepseek_v3_1024gpu.toml");
  ASSERT_EQ(s.model.mtp_num_layers, 0);
  const double f0 = megatron_flops_per_iteration(s);
  s.model.mtp_num_layers = 1;
  const double f1 = megatron_flops_per_iteration(s);
  const auto& m = s.model;
  const double h = m.hidden_size, heads = m.num_attention_heads, seq = s.train->seq_length;
  const double qk = m.qk_head_dim, rope = m.qk_pos_emb_head_dim, v = m.v_head_dim;
  const double mla = m.q_lora_rank * (h + heads * (qk + rope) + 1) + m.kv_lora_rank * (h + heads * (qk + v) + 1) +
                     h * rope + heads * v * h + seq * heads * (qk + rope) / 2 + seq * heads * v / 2;
  const double moe_mlp =
      12.0 * h * 1.5 * (m.moe_ffn_hidden_size * m.moe_router_topk + m.moe_shared_expert_intermediate_size);
  const double V = static_cast<double>(m.padded_vocab_size(s.parallel.tp));
  const double per_token = 6.0 * mla + moe_mlp + 6.0 * (3.0 * h + 2.0 * h * h) + 6.0 * h * V;
  EXPECT_NEAR((f1 - f0) / (s.train->global_batch_size * seq * per_token), 1.0, 1e-12);
}
