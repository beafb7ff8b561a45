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

// A GPT-OSS-shaped model with a 128-key sliding window on every other layer (window_attn_skip_freq =
// 2: layers 2, 4, ... counted from 1 keep full attention): the windowed layers' attention ops carry
// the window, and their core attention is counted as Megatron-Bridge counts it (flop_utils.py: the
// exact causal mean context w - w (w - 1) / (2 s) per query instead of s / 2); the graph's model FLOPs
// agree with the formula.
TEST(MegatronFlops, SlidingWindowLayersCountTheirBand) {
  const std::string base = R"(schema_version = 1
[model]
num_layers = 4
hidden_size = 2880
num_attention_heads = 64
attention = "gqa"
num_query_groups = 8
kv_channels = 64
vocab_size = 201088
num_experts = 32
moe_ffn_hidden_size = 2880
moe_router_topk = 4
WINDOW
[train]
micro_batch_size = 1
global_batch_size = 8
seq_length = 4096
[cluster]
gpu = "h100"
gpus_per_node = 8
nodes = 1
)";
  auto with = [&](const std::string& window) {
    std::string t = base;
    t.replace(t.find("WINDOW"), 6, window);
    return test::scenario_from(t);
  };
  const Scenario full = with("");
  const Scenario swa = with("window_size = 128\nwindow_attn_skip_freq = 2");
  const double S = 4096, w = 128, B = 8, heads = 64, d = 64;
  // Two of the four layers windowed: their core attention (forward, dgrad and wgrad: 3 x 2 x 2 FLOPs per
  // multiply-add of QK^T and PV) over w - w (w - 1) / (2 S) keys per query instead of S / 2.
  const double saved = 2.0 * 3.0 * 2.0 * 2.0 * B * S * heads * d * (S / 2.0 - (w - w * (w - 1.0) / (2.0 * S)));
  EXPECT_NEAR(megatron_flops_per_iteration(full) - megatron_flops_per_iteration(swa), saved, saved * 1e-9);
  const StepGraph g = expand(swa);
  EXPECT_NEAR(graph_model_flops(g) / megatron_flops_per_iteration(swa), 1.0, 0.01);
  int windowed = 0, full_layers = 0;
  for (const auto& op : g.classes.front().ops) {
    if (op.kind != OpKind::attention || (op.flags & kBackward) != 0 || op.microbatch != 0) continue;
    EXPECT_EQ(op.shape[7], op.layer % 2 == 0 ? 128 : 0) << "layer " << op.layer;
    (op.shape[7] > 0 ? windowed : full_layers) += 1;
  }
  EXPECT_EQ(windowed, 2);
  EXPECT_EQ(full_layers, 2);
}

// In an inference step a windowed layer's prefill attention carries the window, and a decode step's
// single query reads only the window's keys of its cache; full-attention layers read the whole cache.
TEST(StepGraph, DecodeAttentionOfAWindowedLayerReadsItsWindow) {
  const Scenario s = test::scenario_from(R"(schema_version = 1
[model]
num_layers = 2
hidden_size = 1024
num_attention_heads = 16
attention = "gqa"
num_query_groups = 4
vocab_size = 32000
num_experts = 8
moe_ffn_hidden_size = 512
moe_router_topk = 2
window_size = 256
window_attn_skip_freq = 2
[infer]
batch_size = 4
prompt_length = 2048
generate_tokens = 3
[cluster]
gpu = "h100"
gpus_per_node = 1
nodes = 1
)");
  int decode = 0, prefill = 0;
  for (const int step : {0, 1}) {  // the prefill, then the first decode step
    const StepGraph g = expand(s, step);
    for (const auto& op : g.classes.front().ops) {
      if (op.kind != OpKind::attention) continue;
      const bool windowed = op.layer == 0;
      if (op.shape[1] == 1) {
        ++decode;
        EXPECT_EQ(op.shape[2], windowed ? 256 : 2048 + 1) << "layer " << op.layer;  // the step's key joins the cache
        EXPECT_EQ(op.shape[7], 0);
      } else {
        ++prefill;
        EXPECT_EQ(op.shape[7], windowed ? 256 : 0) << "layer " << op.layer;
      }
    }
  }
  EXPECT_EQ(decode, 2);
  EXPECT_EQ(prefill, 2);
}
