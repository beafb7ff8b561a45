// FP8 quantisation in the StepGraph (docs/stepgraph.md, "FP8 quantisation"): the casts, amax passes
// and amax all-reduces each recipe emits around the fp8 GEMMs, their bytes, their order, and what
// fp8 GEMMs save for the backward (the memory model's activations).
#include <gtest/gtest.h>

#include <string>

#include "test_util.hpp"
#include "threewalls/scenarios/activations.hpp"
#include "threewalls/scenarios/step_graph.hpp"

using namespace threewalls;
using namespace threewalls::scenarios;

namespace {

// One GPU, one MoE layer shape: hidden 1024, 8 heads of 128 (MHA), 8 experts of 512, top-2, 1024
// tokens per micro-batch, 8 micro-batches.
constexpr std::int64_t kT = 1024;
constexpr std::int64_t kH = 1024;
constexpr std::int64_t kQkv = 3 * 1024;
constexpr std::int64_t kRows = kT * 2;  // routed rows
constexpr std::int64_t kFfn = 512;

std::string fp8_train(const std::string& extra) { return "precision = \"fp8\"\n" + extra; }

StepGraph graph_of(const std::string& parallel, const std::string& train, int gpus, const std::string& model = "") {
  return expand(test::scenario_from(test::small_moe(parallel, train, gpus, model)));
}

const Op* find(const StepGraph& g, const RankClass& rc, const std::string& phase, int layer, int mb) {
  for (const auto& op : rc.ops) {
    if (g.phase_name(op) == phase && op.layer == layer && op.microbatch == mb) return &op;
  }
  return nullptr;
}

std::size_t index_of(const StepGraph& g, const RankClass& rc, const std::string& phase, int layer, int mb) {
  for (std::size_t i = 0; i < rc.ops.size(); ++i) {
    if (g.phase_name(rc.ops[i]) == phase && rc.ops[i].layer == layer && rc.ops[i].microbatch == mb) return i;
  }
  return rc.ops.size();
}

int count(const StepGraph& g, const RankClass& rc, const std::string& phase) {
  int n = 0;
  for (const auto& op : rc.ops) n += g.phase_name(op) == phase ? 1 : 0;
  return n;
}

bool quantises(const Op& op) {
  return op.kind == OpKind::elementwise &&
         (op.elementwise_kind() == ElementwiseKind::quantize || op.elementwise_kind() == ElementwiseKind::amax);
}

}  // namespace

TEST(Fp8Quantisation, Bf16GemmsCastNothing) {
  const StepGraph g = graph_of("", "", 1);
  for (const auto& op : g.classes[0].ops) ASSERT_FALSE(quantises(op)) << g.phase_name(op);
  for (const auto& name : g.phases) EXPECT_EQ(name.find("_cast_"), std::string::npos) << name;
}

TEST(Fp8Quantisation, DelayedScalingCastsEachOperandOnceWithItsTransposeAndNoAmaxPass) {
  const StepGraph g = graph_of("", fp8_train(""), 1);  // the default recipe: delayed
  const RankClass& rc = g.classes[0];
  // Forward: the input, read in bf16 (2 bytes) and written in fp8 rowwise and columnwise (1 + 1).
  const Op* qkv = find(g, rc, "attn_qkv_cast_fwd", 0, 0);
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->kind, OpKind::elementwise);
  EXPECT_EQ(qkv->elementwise_kind(), ElementwiseKind::quantize);
  EXPECT_EQ(qkv->wall, Wall::memory);
  EXPECT_EQ(qkv->shape[0], kT * kH);
  EXPECT_EQ(qkv->shape[1], kT);
  EXPECT_EQ(qkv->shape[2], kH);
  EXPECT_EQ(qkv->shape[3], 1);  // the columnwise copy
  EXPECT_DOUBLE_EQ(qkv->bytes, 4.0 * kT * kH);
  // Backward: the output gradient of each fp8 GEMM before its dgrad.
  const Op* qkv_grad = find(g, rc, "attn_qkv_cast_bwd", 0, 0);
  ASSERT_NE(qkv_grad, nullptr);
  EXPECT_DOUBLE_EQ(qkv_grad->bytes, 4.0 * kT * kQkv);
  EXPECT_NE(qkv_grad->flags & kBackward, 0);
  // Grouped expert GEMMs: their routed rows.
  const Op* fc1 = find(g, rc, "expert_fc1_cast_fwd", 0, 0);
  ASSERT_NE(fc1, nullptr);
  EXPECT_DOUBLE_EQ(fc1->bytes, 4.0 * kRows * kH);
  const Op* fc2_grad = find(g, rc, "expert_fc2_cast_bwd", 0, 0);
  ASSERT_NE(fc2_grad, nullptr);
  EXPECT_DOUBLE_EQ(fc2_grad->bytes, 4.0 * kRows * kH);
  const Op* fc2 = find(g, rc, "expert_fc2_cast_fwd", 0, 0);
  ASSERT_NE(fc2, nullptr);
  EXPECT_DOUBLE_EQ(fc2->bytes, 4.0 * kRows * kFfn);
  // The router and the output layer stay in bf16: no casts.
  EXPECT_EQ(count(g, rc, "router_cast_fwd"), 0);
  EXPECT_EQ(count(g, rc, "lm_head_cast_fwd"), 0);
  // Delayed scaling records the amax in the cast: no amax pass.
  for (const auto& op : rc.ops) EXPECT_NE(op.elementwise_kind(), ElementwiseKind::amax) << g.phase_name(op);
}

TEST(Fp8Quantisation, CastsRunBeforeTheirGemmOnItsStream) {
  const StepGraph g = graph_of("", fp8_train(""), 1);
  const RankClass& rc = g.classes[0];
  for (const std::string gemm : {"attn_qkv", "attn_proj", "expert_fc1", "expert_fc2"}) {
    const std::size_t cast = index_of(g, rc, gemm + "_cast_fwd", 1, 3);
    const std::size_t fwd = index_of(g, rc, gemm + "_fwd", 1, 3);
    ASSERT_LT(cast, rc.ops.size()) << gemm;
    ASSERT_LT(fwd, rc.ops.size()) << gemm;
    EXPECT_LT(cast, fwd) << gemm;
    EXPECT_EQ(rc.ops[cast].stream, rc.ops[fwd].stream) << gemm;
    const std::size_t grad = index_of(g, rc, gemm + "_cast_bwd", 1, 3);
    const std::size_t dgrad = index_of(g, rc, gemm + "_dgrad", 1, 3);
    const std::size_t wgrad = index_of(g, rc, gemm + "_wgrad", 1, 3);
    ASSERT_LT(dgrad, rc.ops.size()) << gemm;
    EXPECT_LT(grad, dgrad) << gemm;
    EXPECT_LT(dgrad, wgrad) << gemm;
  }
}

TEST(Fp8Quantisation, WeightsAreCastOncePerStepAtTheFirstMicrobatch) {
  const StepGraph g = graph_of("", fp8_train(""), 1);
  const RankClass& rc = g.classes[0];
  ASSERT_EQ(g.classes.size(), 1U);
  // 4 layers, 8 micro-batches: one cast per layer and GEMM, at micro-batch 0.
  EXPECT_EQ(count(g, rc, "attn_qkv_weight_cast_fwd"), 4);
  EXPECT_EQ(count(g, rc, "expert_fc1_weight_cast_fwd"), 4);
  const Op* w = find(g, rc, "attn_qkv_weight_cast_fwd", 2, 0);
  ASSERT_NE(w, nullptr);
  EXPECT_DOUBLE_EQ(w->bytes, 4.0 * kH * kQkv);  // bf16 weight -> fp8 and its transpose
  EXPECT_EQ(w->dtype, DType::bf16);
  // One weight per local expert.
  const Op* we = find(g, rc, "expert_fc1_weight_cast_fwd", 2, 0);
  ASSERT_NE(we, nullptr);
  EXPECT_DOUBLE_EQ(we->bytes, 4.0 * 8 * kH * 2 * kFfn);
  // Weights kept in fp8 (fp8_param_gather): only the transpose, from the fp8 weight.
  const StepGraph k = graph_of("", fp8_train("fp8_param_gather = true\n"), 1);
  const Op* wk = find(k, k.classes[0], "attn_qkv_weight_cast_fwd", 2, 0);
  ASSERT_NE(wk, nullptr);
  EXPECT_DOUBLE_EQ(wk->bytes, 2.0 * kH * kQkv);
  EXPECT_EQ(wk->dtype, DType::fp8);
}

TEST(Fp8Quantisation, TensorwiseScalingAddsAnAmaxPassBeforeEveryCast) {
  const StepGraph g = graph_of("", fp8_train("fp8_recipe = \"tensorwise\"\n"), 1);
  const RankClass& rc = g.classes[0];
  const Op* amax = find(g, rc, "expert_fc1_amax_fwd", 0, 0);
  ASSERT_NE(amax, nullptr);
  EXPECT_EQ(amax->elementwise_kind(), ElementwiseKind::amax);
  EXPECT_DOUBLE_EQ(amax->bytes, 2.0 * kRows * kH);  // one read of the bf16 tensor
  EXPECT_LT(index_of(g, rc, "expert_fc1_amax_fwd", 0, 0), index_of(g, rc, "expert_fc1_cast_fwd", 0, 0));
  const Op* grad_amax = find(g, rc, "attn_proj_amax_bwd", 0, 0);
  ASSERT_NE(grad_amax, nullptr);
  EXPECT_DOUBLE_EQ(grad_amax->bytes, 2.0 * kT * kH);
  // The bf16 weight's amax too, once per step.
  EXPECT_EQ(count(g, rc, "attn_qkv_weight_amax_fwd"), 4);
  // Same cast bytes as delayed scaling; no amax all-reduce without sequence parallelism.
  EXPECT_DOUBLE_EQ(find(g, rc, "expert_fc1_cast_fwd", 0, 0)->bytes, 4.0 * kRows * kH);
  for (const auto& op : rc.ops) EXPECT_NE(op.kind, OpKind::collective) << g.phase_name(op);
}

TEST(Fp8Quantisation, BlockScalesAddTheirBytes) {
  const StepGraph b = graph_of("", fp8_train("fp8_recipe = \"blockwise\"\nfp8_format = \"e4m3\"\n"), 1);
  // One fp32 scale per 1 x 128 block, in each orientation.
  EXPECT_DOUBLE_EQ(find(b, b.classes[0], "expert_fc1_cast_fwd", 0, 0)->bytes, (4.0 + 2 * 4.0 / 128) * kRows * kH);
  for (const auto& op : b.classes[0].ops) EXPECT_NE(op.elementwise_kind(), ElementwiseKind::amax);
  std::string model = "";
  std::string mx = test::small_moe("", fp8_train("fp8_recipe = \"mxfp8\"\n"), 1, model);
  mx.replace(mx.find("gpu = \"h100\""), 12, "gpu = \"b200\"");
  const StepGraph m = expand(test::scenario_from(mx));
  // One E8M0 byte per 1 x 32 block, in each orientation.
  EXPECT_DOUBLE_EQ(find(m, m.classes[0], "expert_fc1_cast_fwd", 0, 0)->bytes, (4.0 + 2.0 / 32) * kRows * kH);
}

TEST(Fp8Quantisation, TensorwiseWithSequenceParallelismReducesTheGatheredAmaxOverTp) {
  const StepGraph g = graph_of("tp = 2\nsequence_parallel = true", fp8_train("fp8_recipe = \"tensorwise\"\n"), 2);
  const RankClass& rc = g.classes[0];
  // The column-parallel QKV reads the gathered input; the row-parallel projection's output gradient
  // arrives gathered (the backward of its reduce-scatter).
  for (const std::string phase : {"attn_qkv_amax_allreduce_fwd", "attn_proj_amax_allreduce_bwd"}) {
    const Op* ar = find(g, rc, phase, 0, 0);
    ASSERT_NE(ar, nullptr) << phase;
    EXPECT_EQ(ar->kind, OpKind::collective);
    EXPECT_EQ(ar->collective(), Collective::all_reduce);
    EXPECT_EQ(ar->group, Group::tp);
    EXPECT_EQ(ar->group_size, 2);
    EXPECT_DOUBLE_EQ(ar->bytes, 4.0);
  }
  // The projection's input (the attention output) and the QKV's output gradient are not gathered.
  EXPECT_EQ(count(g, rc, "attn_proj_amax_allreduce_fwd"), 0);
  EXPECT_EQ(count(g, rc, "attn_qkv_amax_allreduce_bwd"), 0);
  EXPECT_EQ(count(g, rc, "expert_fc1_amax_allreduce_fwd"), 0);
  // Delayed scaling has no per-tensor reduction.
  const StepGraph d = graph_of("tp = 2\nsequence_parallel = true", fp8_train(""), 2);
  EXPECT_EQ(count(d, d.classes[0], "attn_qkv_amax_allreduce_fwd"), 0);
}

TEST(Fp8Quantisation, DelayedScalingReducesEachPassesAmaxesOverTheDataParallelGroup) {
  const StepGraph g = graph_of("", fp8_train(""), 2);  // dp = 2: 4 micro-batches each
  const RankClass& rc = g.classes[0];
  EXPECT_EQ(count(g, rc, "fp8_amax_allreduce_fwd"), 4);
  EXPECT_EQ(count(g, rc, "fp8_amax_allreduce_bwd"), 4);
  const Op* f = find(g, rc, "fp8_amax_allreduce_fwd", 3, 0);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->group, Group::dp_cp);
  EXPECT_EQ(f->collective(), Collective::all_reduce);
  // One fp32 per input and weight of the 4 layers' fp8 GEMMs (QKV, projection, 2 expert GEMMs).
  EXPECT_DOUBLE_EQ(f->bytes, 4.0 * 4 * 4 * 2);
  const Op* b = find(g, rc, "fp8_amax_allreduce_bwd", 0, 0);
  ASSERT_NE(b, nullptr);
  EXPECT_DOUBLE_EQ(b->bytes, 4.0 * 4 * 4);
  // Current scaling reduces nothing per pass.
  const StepGraph t = graph_of("", fp8_train("fp8_recipe = \"tensorwise\"\n"), 2);
  EXPECT_EQ(count(t, t.classes[0], "fp8_amax_allreduce_fwd"), 0);
}

TEST(Fp8Quantisation, RecomputeCastsTheInputAgainButNotTheWeight) {
  const StepGraph g = graph_of("", fp8_train("recompute_granularity = \"full\"\nrecompute_method = \"uniform\"\n"), 1);
  const RankClass& rc = g.classes[0];
  EXPECT_EQ(count(g, rc, "attn_qkv_cast_recompute"), 4 * 8);
  EXPECT_EQ(count(g, rc, "attn_qkv_weight_cast_recompute"), 0);
  EXPECT_EQ(count(g, rc, "attn_qkv_weight_cast_fwd"), 4);
  const Op* r = find(g, rc, "attn_qkv_cast_recompute", 0, 0);
  ASSERT_NE(r, nullptr);
  EXPECT_NE(r->flags & kRecompute, 0);
}

TEST(Fp8Quantisation, InferenceCastsActivationsRowwiseOnly) {
  const std::string text =
      "schema_version = 1\n[model]\nnum_layers = 2\nhidden_size = 1024\nnum_attention_heads = 8\n"
      "vocab_size = 32000\nnum_experts = 8\nmoe_ffn_hidden_size = 512\nmoe_router_topk = 2\n"
      "[infer]\nprecision = \"fp8\"\nbatch_size = 4\nprompt_length = 256\ngenerate_tokens = 1\n"
      "[cluster]\ngpu = \"h100\"\ngpus_per_node = 1\nnodes = 1\n";
  const StepGraph g = expand(test::scenario_from(text), 0);
  const RankClass& rc = g.classes[0];
  const Op* c = find(g, rc, "attn_qkv_cast_fwd", 0, -1);
  if (c == nullptr) c = find(g, rc, "attn_qkv_cast_fwd", 0, 0);
  ASSERT_NE(c, nullptr);
  EXPECT_DOUBLE_EQ(c->bytes, 3.0 * 4 * 256 * kH);  // read 2, write the rowwise copy 1
  EXPECT_EQ(c->shape[3], 0);
  EXPECT_EQ(count(g, rc, "attn_qkv_weight_cast_fwd"), 0);  // fp8 weights, quantised before serving
}

TEST(Fp8Quantisation, Fp8GemmsSaveTheirInputsInFp8) {
  const Scenario bf = test::scenario_from(test::small_moe("", "", 1));
  const Scenario f8 = test::scenario_from(test::small_moe("", fp8_train(""), 1));
  ActivationOptions opt;
  const double diff = layer_activation_bytes(bf, 0, 1.0, opt, true) - layer_activation_bytes(f8, 0, 1.0, opt, true);
  // Saved 1 byte instead of 2: the QKV input, the routed rows entering each expert GEMM; the
  // attention output is kept in bf16 for the attention backward and in fp8 for the projection.
  const double expected = 1.0 * kT * kH + 1.0 * kRows * kH + 1.0 * kRows * kFfn - 1.0 * kT * kH;
  EXPECT_DOUBLE_EQ(diff, expected);
  // A dense layer: the MLP norm's output is the fp8 fc1's input (the MoE's is the bf16 router's).
  const std::string dense_model = "ffn_hidden_size = 4096\nfirst_dense_layers = 1\n";
  const Scenario dbf = test::scenario_from(test::small_moe("", "", 1, dense_model));
  const Scenario df8 = test::scenario_from(test::small_moe("", fp8_train(""), 1, dense_model));
  const double dense_diff =
      layer_activation_bytes(dbf, 0, 1.0, opt, true) - layer_activation_bytes(df8, 0, 1.0, opt, true);
  EXPECT_DOUBLE_EQ(dense_diff, 1.0 * kT * kH + 1.0 * kT * kH + 1.0 * kT * 4096 - 1.0 * kT * kH);
}

// first_last_layers_bf16 (Megatron-Bridge's current-scaling default): the first and last layers' GEMMs
// run in bf16 without casts; the layers between keep theirs; the counts move the boundary.
TEST(Fp8Quantisation, FirstAndLastLayersInBf16CastNothing) {
  auto dtypes = [](const StepGraph& g, int layer) {
    int fp8 = 0, bf16 = 0, casts = 0;
    for (const auto& op : g.classes[0].ops) {
      if (op.layer != layer || op.microbatch != 0) continue;
      if (g.phase_name(op).find("_cast_") != std::string::npos) ++casts;
      if (op.kind != OpKind::gemm && op.kind != OpKind::grouped_gemm) continue;
      if (g.phase_name(op).rfind("router", 0) == 0) continue;  // the router is bf16 in every layer
      (op.dtype == DType::fp8 ? fp8 : bf16) += 1;
    }
    return std::array<int, 3>{fp8, bf16, casts};
  };
  const StepGraph g = graph_of("", fp8_train("fp8_recipe = \"tensorwise\"\nfirst_last_layers_bf16 = true\n"), 1);
  for (const int layer : {0, 3}) {
    const auto d = dtypes(g, layer);
    EXPECT_EQ(d[0], 0) << layer;
    EXPECT_GT(d[1], 0) << layer;
    EXPECT_EQ(d[2], 0) << layer;
  }
  for (const int layer : {1, 2}) {
    const auto d = dtypes(g, layer);
    EXPECT_GT(d[0], 0) << layer;
    EXPECT_EQ(d[1], 0) << layer;
    EXPECT_GT(d[2], 0) << layer;
  }
  const StepGraph two =
      graph_of("",
               fp8_train("fp8_recipe = \"tensorwise\"\nfirst_last_layers_bf16 = true\nnum_layers_at_start_in_bf16 = 2\n"
                         "num_layers_at_end_in_bf16 = 0\n"),
               1);
  EXPECT_EQ(dtypes(two, 1)[0], 0);
  EXPECT_GT(dtypes(two, 3)[0], 0);
}
