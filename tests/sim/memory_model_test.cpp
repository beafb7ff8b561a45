// The memory model against Megatron's published formulas (Korthikanti et al. 2022, "Reducing
// Activation Recomputation in Large Transformer Models", and the distributed optimizer's bytes per
// parameter), published parameter counts, and an OOM verdict with its breakdown.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "sim_test_support.hpp"
#include "threewalls/scenarios/layout.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/sim/memory_model.hpp"

namespace threewalls::sim {
namespace {

using scenarios::RecomputeGranularity;
using scenarios::Scenario;

// A GPT layer as in the paper: MHA, GeLU MLP of 4h, LayerNorm, micro-batch 1, sequence 2048.
Scenario gpt(int layers, int h, int a, int tp, bool sp, int pp = 1, int dp = 1) {
  Scenario s;
  s.name = "gpt";
  s.model.num_layers = layers;
  s.model.hidden_size = h;
  s.model.ffn_hidden_size = 4 * h;
  s.model.num_attention_heads = a;
  s.model.num_query_groups = a;
  s.model.kv_channels = h / a;
  s.model.vocab_size = 51200;
  s.model.swiglu = false;
  s.model.normalization = scenarios::Normalization::layernorm;
  s.parallel.tp = tp;
  s.parallel.pp = pp;
  s.parallel.dp = dp;
  s.parallel.edp = dp * tp;
  s.parallel.sequence_parallel = sp;
  s.train.emplace();
  s.train->micro_batch_size = 1;
  s.train->seq_length = 2048;
  s.train->global_batch_size = 64 * dp;
  s.train->num_microbatches = 64;
  s.train->use_distributed_optimizer = false;
  s.cluster = testing::cluster(8, tp * pp * dp / 8 > 0 ? tp * pp * dp / 8 : 1);
  return s;
}

const MemoryOptions kPaper{/*fused_attention=*/false, /*dropout=*/true};

struct Shape {
  const char* name;
  int h, a;
  // Bytes of one layer, one micro-batch, s = 2048, b = 1, t = 8 (t = 1 for the first):
  double none_t1;      // sbh (34 + 5as/h)
  double tp8;          // sbh (10 + 24/t + 5as/(ht))
  double tp8_sp;       // sbh (34/t + 5as/(ht))
  double tp8_sp_sel;   // sbh 34/t
};
// GPT-3 175B (h 12288, a 96) and MT-NLG 530B (h 20480, a 128), the paper's Table 3 models.
const Shape kShapes[] = {
    {"GPT-3 175B", 12288, 96, 2868903936.0, 578813952.0, 358612992.0, 106954752.0},
    {"MT-NLG 530B", 20480, 128, 4110417920.0, 880803840.0, 513802240.0, 178257920.0},
};

TEST(MemoryModel, ActivationsPerLayerMatchKorthikantiOnTwoModelShapes) {
  for (const Shape& sh : kShapes) {
    SCOPED_TRACE(sh.name);
    EXPECT_DOUBLE_EQ(scenarios::layer_activation_bytes(gpt(1, sh.h, sh.a, 1, false), 0, 1.0, kPaper.activations()),
                     sh.none_t1);
    EXPECT_DOUBLE_EQ(scenarios::layer_activation_bytes(gpt(1, sh.h, sh.a, 8, false), 0, 1.0, kPaper.activations()),
                     sh.tp8);
    EXPECT_DOUBLE_EQ(scenarios::layer_activation_bytes(gpt(1, sh.h, sh.a, 8, true), 0, 1.0, kPaper.activations()),
                     sh.tp8_sp);
    Scenario sel = gpt(1, sh.h, sh.a, 8, true);
    sel.train->recompute_granularity = RecomputeGranularity::selective;
    sel.train->recompute_modules = {"core_attn"};
    EXPECT_DOUBLE_EQ(scenarios::layer_activation_bytes(sel, 0, 1.0, kPaper.activations()), sh.tp8_sp_sel);
  }
}

TEST(MemoryModel, FusedAttentionKeepsOnlyTheLogSumExpInsteadOfTheScores) {
  const Shape& sh = kShapes[0];
  const Scenario s = gpt(1, sh.h, sh.a, 8, true);
  const double lse = 4.0 * 2048 * (sh.a / 8.0);
  EXPECT_DOUBLE_EQ(scenarios::layer_activation_bytes(s, 0, 1.0, scenarios::ActivationOptions{true, true}),
                   sh.tp8_sp_sel + lse);
}

TEST(MemoryModel, FullRecomputationStoresOnlyEachLayersInput) {
  // Paper: full recomputation keeps 2sbh per layer (no sequence parallelism).
  Scenario s = gpt(8, 12288, 96, 8, false);
  s.train->recompute_granularity = RecomputeGranularity::full;
  s.train->recompute_method = scenarios::RecomputeMethod::uniform;
  s.train->recompute_num_layers = 1;
  scenarios::StepGraph g;
  g.layout = scenarios::Layout(8, 1, 1, 1, 1, 1, 8, 8);
  scenarios::RankClass rc;
  rc.ranks = {0, 1, 2, 3, 4, 5, 6, 7};
  rc.layers = {0, 1, 2, 3, 4, 5, 6, 7};
  g.classes.push_back(rc);
  const MemoryReport r = memory_model(s, g, kPaper);
  const double sbh = 2048.0 * 12288;
  const double per_layer = scenarios::layer_activation_bytes(s, 0, 1.0, kPaper.activations());
  // 1F1B without pipeline: one micro-batch in flight; 8 inputs of 2sbh, one layer being recomputed,
  // and the output layer's tensors (final norm input, output input: 2sbh each; logits 4 s V / t).
  const double vocab = static_cast<double>(s.model.padded_vocab_size(8));
  const double edges = sbh + 2.0 * sbh + 2.0 * 2.0 * sbh + 4.0 * 2048 * vocab / 8;
  EXPECT_DOUBLE_EQ(r.classes[0].breakdown.activations.value, 8 * 2.0 * sbh + per_layer + edges);
}

TEST(MemoryModel, MicroBatchesInFlightFollowTheSchedule) {
  // 1F1B: stage s of p holds p - s micro-batches (the first stage holds p).
  EXPECT_EQ(inflight_chunk_microbatches(8, 1, 0, 64), 8);
  EXPECT_EQ(inflight_chunk_microbatches(8, 1, 7, 64), 1);
  EXPECT_EQ(inflight_chunk_microbatches(8, 1, 0, 4), 4);
  // Interleaved: 2 (p - s - 1) + (v - 1) p + 1 chunks; for p 8, v 4 the first stage holds 39 chunks
  // = 9.75 stages' worth, the paper's p (1 + (p - 1) / (p v)).
  EXPECT_EQ(inflight_chunk_microbatches(8, 4, 0, 64), 39);
  // The expert-parallel overlap keeps one more chunk-micro-batch (Megatron's extra warm-up step).
  EXPECT_EQ(inflight_chunk_microbatches(8, 4, 0, 64, true), 40);
  EXPECT_EQ(inflight_chunk_microbatches(1, 1, 0, 64, true), 2);
  EXPECT_EQ(inflight_chunk_microbatches(1, 1, 0, 1, true), 1);
  EXPECT_DOUBLE_EQ(39.0 / 4.0, 8.0 * (1.0 + 7.0 / 32.0));
}

TEST(MemoryModel, BytesPerParameterAreEighteenOrSixPlusTwelveOverD) {
  EXPECT_DOUBLE_EQ(training_bytes_per_parameter(false, 64), 18.0);
  EXPECT_DOUBLE_EQ(training_bytes_per_parameter(true, 8), 7.5);
  EXPECT_DOUBLE_EQ(training_bytes_per_parameter(true, 64), 6.1875);
  // The model's weights + gradients + optimizer state per parameter, on a dense stage with d = 8.
  for (bool distributed : {false, true}) {
    Scenario s = gpt(4, 4096, 32, 1, false, 1, 8);
    s.train->use_distributed_optimizer = distributed;
    scenarios::StepGraph g;
    g.layout = scenarios::Layout(1, 1, 8, 1, 1, 1, 8, 8);
    scenarios::RankClass rc;
    rc.ranks = {0, 1, 2, 3, 4, 5, 6, 7};
    rc.layers = {0, 1, 2, 3};
    g.classes.push_back(rc);
    const auto& c = memory_model(s, g).classes[0];
    const double state = (c.breakdown.weights + c.breakdown.gradients + c.breakdown.optimizer).value;
    EXPECT_DOUBLE_EQ(state / c.params.total(), training_bytes_per_parameter(distributed, 8));
  }
}

// The parameter state's precision keys (Megatron's --grad-reduce-in-bf16, --fp8-param-gather and the
// precision-aware optimizer's bf16 moments): the memory model charges 1 + 2 bytes per parameter and 4 +
// 2 + 2 per shard parameter, and the expansion's gradient reductions, parameter gathers, gradient norm
// and Adam step move the same bytes (scenarios::parameter_bytes, the one owner).
TEST(MemoryModel, ParameterPrecisionKeysSetTheStateBytesAndTheDataParallelTraffic) {
  std::ifstream in(testing::source_dir() / "scenarios/examples/mixtral_8x7b_64gpu.toml");
  std::stringstream text;
  text << in.rdbuf();
  const std::string base = text.str();
  std::string low = base;
  low.replace(low.find("overlap_param_gather = true"), 27,
              "overlap_param_gather = true\nprecision = \"fp8\"\ngrad_reduce_in_fp32 = false\nfp8_param_gather = true\n"
              "exp_avg_dtype = \"bf16\"\nexp_avg_sq_dtype = \"bf16\"");
  std::string fp8 = base;
  fp8.replace(fp8.find("overlap_param_gather = true"), 27, "overlap_param_gather = true\nprecision = \"fp8\"");
  const Scenario sd = scenarios::load_scenario_text(fp8, "fp8.toml").scenario;
  const Scenario sl = scenarios::load_scenario_text(low, "low.toml").scenario;
  const scenarios::StepGraph gd = scenarios::expand(sd, 0);
  const scenarios::StepGraph gl = scenarios::expand(sl, 0);
  const MemoryReport rd = memory_model(sd, gd);
  const MemoryReport rl = memory_model(sl, gl);
  const ClassMemory& d = rd.classes[0];
  const ClassMemory& l = rl.classes[0];
  const double n = l.params.total();
  EXPECT_DOUBLE_EQ(d.breakdown.weights.value, 2.0 * n);
  EXPECT_DOUBLE_EQ(d.breakdown.gradients.value, 4.0 * n);
  EXPECT_DOUBLE_EQ(l.breakdown.weights.value, 1.0 * n);
  EXPECT_DOUBLE_EQ(l.breakdown.gradients.value, 2.0 * n);
  EXPECT_DOUBLE_EQ(l.breakdown.optimizer.value / d.breakdown.optimizer.value, 8.0 / 12.0);
  // Bytes of the data-parallel side of class 0, by phase.
  auto bytes = [](const scenarios::StepGraph& g, const std::string& phase) {
    double sum = 0.0;
    for (const auto& op : g.classes[0].ops) sum += g.phase_name(op) == phase ? op.bytes : 0.0;
    return sum;
  };
  for (const char* ph : {"dp_grad_reduce_scatter", "edp_grad_reduce_scatter", "optimizer_grad_norm"}) {
    ASSERT_GT(bytes(gd, ph), 0.0) << ph;
    EXPECT_DOUBLE_EQ(bytes(gl, ph) / bytes(gd, ph), 0.5) << ph;
  }
  for (const char* ph : {"dp_param_allgather", "edp_param_allgather"}) {
    ASSERT_GT(bytes(gd, ph), 0.0) << ph;
    EXPECT_DOUBLE_EQ(bytes(gl, ph) / bytes(gd, ph), 0.5) << ph;
  }
  // Adam: 2 x (master + moments) + gradient + weight per shard parameter: 30 -> 19.
  EXPECT_DOUBLE_EQ(bytes(gl, "optimizer_step") / bytes(gd, "optimizer_step"), 19.0 / 30.0);
}

// Megatron-FSDP: weights, gradients and optimizer state are the rank's shard (dense parameters over
// dp x cp, experts over edp), plus the units gathered at once (two per chain of passes, the largest
// unit counted for each) in bf16 weights and fp32 gradients. Mixtral-8x7B on 64 H100 without a
// pipeline (EP 8, DP 64) is out of memory with the distributed optimizer and fits with FSDP.
TEST(MemoryModel, FsdpShardsWeightsGradientsAndOptimizerState) {
  std::ifstream in(testing::source_dir() / "scenarios/examples/mixtral_8x7b_64gpu.toml");
  std::stringstream text;
  text << in.rdbuf();
  std::string base = text.str();
  base.replace(base.find("pp = 4"), 6, "pp = 1");
  std::string fsdp = base;
  fsdp.replace(fsdp.find("overlap_param_gather = true"), 27,
               "data_parallel_sharding_strategy = \"optim_grads_params\"");
  const Scenario sd = scenarios::load_scenario_text(base, "dist_opt.toml").scenario;
  const Scenario sf = scenarios::load_scenario_text(fsdp, "fsdp.toml").scenario;
  const MemoryReport rd = memory_model(sd, scenarios::expand(sd, 0));
  const MemoryReport rf = memory_model(sf, scenarios::expand(sf, 0));
  ASSERT_EQ(rf.classes.size(), 1U);
  const ClassMemory& d = rd.classes[0];
  const ClassMemory& f = rf.classes[0];
  EXPECT_TRUE(rd.oom());
  EXPECT_FALSE(rf.oom());
  const double shard = f.params.dense / 64 + f.params.expert / 8;
  double largest = 0.0;
  for (int l = 0; l < 32; ++l) largest = std::max(largest, scenarios::layer_parameters(sf, l).total());
  largest = std::max(largest, scenarios::embedding_parameters(sf));
  EXPECT_DOUBLE_EQ(scenarios::fsdp_gathered_parameters(sf, {0, 1}, true, true), 2.0 * largest);
  EXPECT_DOUBLE_EQ(scenarios::fsdp_gathered_parameters(sd, {0, 1}, true, true), 0.0);
  EXPECT_DOUBLE_EQ(f.breakdown.weights.value, 2.0 * (shard + 2.0 * largest));
  EXPECT_DOUBLE_EQ(f.breakdown.gradients.value, 4.0 * (shard + 2.0 * largest));
  EXPECT_DOUBLE_EQ(f.breakdown.optimizer.value, 12.0 * shard);
  EXPECT_DOUBLE_EQ(d.breakdown.optimizer.value, f.breakdown.optimizer.value);
  EXPECT_DOUBLE_EQ(d.breakdown.weights.value, 2.0 * d.params.total());
  EXPECT_DOUBLE_EQ(f.breakdown.activations.value, d.breakdown.activations.value);
}

TEST(MemoryModel, ParameterCountsOfPublishedModels) {
  struct Case {
    const char* file;
    double billions;  // published total parameters
  };
  // Mixtral 8x7B 46.7B (arXiv:2401.04088), DeepSeek-V3 671B without its MTP module
  // (arXiv:2412.19437), Qwen3-235B-A22B 235B.
  for (const Case& c : {Case{"mixtral_8x7b_64gpu.toml", 46.7}, Case{"deepseek_v3_2048gpu.toml", 671.0},
                        Case{"qwen3_235b_256gpu.toml", 235.0}}) {
    const Scenario s = scenarios::load_scenario(testing::source_dir() / "scenarios/examples" / c.file);
    EXPECT_NEAR(scenarios::model_parameters(s.model) / 1e9, c.billions, 0.01 * c.billions) << c.file;
  }
  // DeepSeek-V3 with its MTP module: 685B (the published checkpoint's count; the module's embedding
  // and output head copies, about 1.9B, are the main model's in Megatron and not counted again).
  Scenario dsv3 = scenarios::load_scenario(testing::source_dir() / "scenarios/examples/deepseek_v3_2048gpu.toml");
  dsv3.model.mtp_num_layers = 1;
  EXPECT_NEAR(scenarios::model_parameters(dsv3.model) / 1e9, 685.0, 0.01 * 685.0);
}

// The memory model holds exactly the parameters that the expansion reduces and steps (one count,
// scenarios/parameters.hpp), on every stage of uneven and interleaved pipelines.
TEST(MemoryModel, ClassParametersAreTheExpansions) {
  for (const char* f :
       {"examples/mixtral_8x7b_64gpu.toml", "examples/deepseek_v3_2048gpu.toml", "examples/deepseek_v3_1024gpu.toml",
        "examples/qwen3_235b_256gpu.toml", "examples/small_moe_tp2_ep2.toml",
        "validation/scale/dsv3_1024gpu_h100_fp8.toml"}) {  // an MTP depth on the last stage
    const Scenario s = scenarios::load_scenario(testing::source_dir() / "scenarios" / f);
    const auto g = scenarios::expand(s, 0);
    const MemoryReport r = memory_model(s, g);
    ASSERT_EQ(r.classes.size(), g.classes.size());
    for (std::size_t i = 0; i < g.classes.size(); ++i) {
      EXPECT_EQ(r.classes[i].params.dense, g.classes[i].dense_params) << f << " class " << i;
      EXPECT_EQ(r.classes[i].params.expert, g.classes[i].expert_params) << f << " class " << i;
    }
  }
}

TEST(MemoryModel, OomScenarioIsReportedWithItsBreakdown) {
  // GPT-3 175B on one node (TP 8, no pipeline) without the distributed optimizer: 18 bytes for each
  // of ~21.9e9 parameters per GPU, far above 80 GB.
  Scenario s = gpt(96, 12288, 96, 8, true);
  s.cluster = testing::cluster(8, 1);
  scenarios::StepGraph g;
  g.layout = scenarios::Layout(8, 1, 1, 1, 1, 1, 8, 8);
  scenarios::RankClass rc;
  rc.ranks = {0, 1, 2, 3, 4, 5, 6, 7};
  rc.label = "stage 0";
  for (int l = 0; l < 96; ++l) rc.layers.push_back(l);
  g.classes.push_back(rc);
  const MemoryReport r = memory_model(s, g);
  ASSERT_TRUE(r.oom());
  EXPECT_EQ(r.first_oom_class(), 0);
  const ClassMemory& c = r.classes[0];
  const scenarios::ParameterCount p = scenarios::rank_parameters(s, rc.layers, true, true);
  EXPECT_NEAR(p.total() / 1e9, 175.0 / 8, 0.03 * 175.0 / 8);
  EXPECT_DOUBLE_EQ(c.breakdown.weights.value, 2.0 * p.total());
  EXPECT_DOUBLE_EQ(c.breakdown.gradients.value, 4.0 * p.total());
  EXPECT_DOUBLE_EQ(c.breakdown.optimizer.value, 12.0 * p.total());
  EXPECT_DOUBLE_EQ(c.peak().value, (c.breakdown.weights + c.breakdown.gradients + c.breakdown.optimizer +
                                    c.breakdown.activations + c.breakdown.buffers + c.breakdown.graph_pools)
                                       .value);
  EXPECT_GT(c.peak().value, 80e9);
  // With TP 8 x PP 8 and the distributed optimizer over DP 8 the same model fits.
  Scenario fit = gpt(96, 12288, 96, 8, true, 8, 8);
  fit.train->use_distributed_optimizer = true;
  fit.train->recompute_granularity = RecomputeGranularity::selective;
  scenarios::StepGraph g2;
  g2.layout = scenarios::Layout(8, 1, 8, 8, 1, 1, 64, 8);
  for (int st = 0; st < 8; ++st) {
    scenarios::RankClass c2;
    c2.id = st;
    c2.pp_stage = st;
    c2.ranks = {st * 64};
    for (int l = 12 * st; l < 12 * st + 12; ++l) c2.layers.push_back(l);
    g2.classes.push_back(c2);
  }
  EXPECT_FALSE(memory_model(fit, g2).oom());
}

TEST(MemoryModel, MeasuredDeviceMemoryCountsTheContextOnceAndHandlesPerStream) {
  // f03-like: one GPU, fused attention on the compute stream; the profile's device.memory replaces
  // the fixed constants: context and modules once, the first cuBLASLt, one further per extra stream
  // with ops, a cuDNN handle per stream that runs fused attention.
  const Scenario s =
      scenarios::load_scenario(testing::source_dir() / "scenarios/validation/fidelity/f03_moe64_top8_1gpu.toml");
  const auto g = scenarios::expand(s, 0);
  ASSERT_EQ(g.classes.size(), 1U);
  std::set<int> streams, fused;
  for (const auto& op : g.classes[0].ops) {
    if (op.kind == scenarios::OpKind::host) continue;
    streams.insert(op.stream);
    if (op.kind == scenarios::OpKind::attention &&
        scenarios::attention_kernel(op) != scenarios::AttentionKernel::unfused) {
      fused.insert(op.stream);
    }
  }
  ASSERT_FALSE(fused.empty());
  MemoryOptions measured;
  measured.device =
      DeviceMemoryParams{Bytes(600e6), Bytes(10e6), Bytes(150e6), Bytes(40e6), Bytes(300e6), Bytes(2097152)};
  const double with = memory_model(s, g, measured).classes[0].breakdown.buffers.value;
  const double without = memory_model(s, g).classes[0].breakdown.buffers.value;
  const double further = static_cast<double>(streams.size() - 1);
  EXPECT_DOUBLE_EQ(with - without, 600e6 + 10e6 + 150e6 + further * 40e6 + static_cast<double>(fused.size()) * 300e6 -
                                       kCudaContextBytes - further * kOpRunnerWorkspaceBytes);
}

}  // namespace
}  // namespace threewalls::sim
