// threewalls import (docs/import.md): the public Megatron-MoE launches and Hugging Face configs in
// tests/scenarios/fixtures/import/ and scenarios/inputs/ become scenarios whose model, layout and FLOPs per iteration
// match the hand-written examples; every argument is accounted for; bad input is refused by name.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "test_support.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/import.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::scenarios {
namespace {

std::filesystem::path fixture(const std::string& name) {
  return testing::source_dir() / "tests/scenarios/fixtures/import" / name;
}

// The sample inputs the documentation names (scenarios/inputs/), tested where they ship.
std::filesystem::path sample(const std::string& name) { return testing::source_dir() / "scenarios/inputs" / name; }

Scenario example(const std::string& name) { return load_scenario(testing::source_dir() / "scenarios/examples" / name); }

// import -> TOML -> the normal loader (which validates) -> Scenario.
Scenario load_draft(ScenarioDraft d, const std::string& cluster, int gpus) {
  add_cluster_table(d, cluster, gpus);
  const std::string text = d.to_toml();
  try {
    return load_scenario_text(text, "imported.toml").scenario;
  } catch (const ScenarioError& e) {
    ADD_FAILURE() << e.what() << "\n--- imported TOML ---\n" << text;
    throw;
  }
}

bool reported(const std::vector<ImportNote>& notes, const std::string& name) {
  return std::any_of(notes.begin(), notes.end(), [&](const ImportNote& n) { return n.name == name; });
}

void expect_same_model(const ModelSpec& a, const ModelSpec& b) {
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.attention, b.attention);
  EXPECT_EQ(a.num_query_groups, b.num_query_groups);
  if (a.attention != AttentionKind::mla) {
    EXPECT_EQ(a.kv_channels, b.kv_channels);
  }
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.kv_lora_rank, b.kv_lora_rank);
  EXPECT_EQ(a.qk_head_dim, b.qk_head_dim);
  EXPECT_EQ(a.qk_pos_emb_head_dim, b.qk_pos_emb_head_dim);
  EXPECT_EQ(a.v_head_dim, b.v_head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.swiglu, b.swiglu);
  EXPECT_EQ(a.untie_embeddings_and_output_weights, b.untie_embeddings_and_output_weights);
  EXPECT_EQ(a.normalization, b.normalization);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.moe_ffn_hidden_size, b.moe_ffn_hidden_size);
  EXPECT_EQ(a.moe_router_topk, b.moe_router_topk);
  EXPECT_EQ(a.moe_router_num_groups, b.moe_router_num_groups);
  EXPECT_EQ(a.moe_router_group_topk, b.moe_router_group_topk);
  EXPECT_EQ(a.moe_shared_expert_intermediate_size, b.moe_shared_expert_intermediate_size);
  EXPECT_EQ(a.first_dense_layers, b.first_dense_layers);
  EXPECT_EQ(a.moe_layer_freq, b.moe_layer_freq);
  EXPECT_EQ(a.ffn_hidden_size, b.ffn_hidden_size);
}

void expect_same_layout(const Scenario& a, const Scenario& b, bool compare_split = true) {
  EXPECT_EQ(a.world_size(), b.world_size());
  EXPECT_EQ(a.parallel.tp, b.parallel.tp);
  EXPECT_EQ(a.parallel.cp, b.parallel.cp);
  EXPECT_EQ(a.parallel.pp, b.parallel.pp);
  EXPECT_EQ(a.parallel.vpp, b.parallel.vpp);
  EXPECT_EQ(a.parallel.dp, b.parallel.dp);
  EXPECT_EQ(a.parallel.ep, b.parallel.ep);
  EXPECT_EQ(a.parallel.etp, b.parallel.etp);
  EXPECT_EQ(a.parallel.edp, b.parallel.edp);
  EXPECT_EQ(a.parallel.sequence_parallel, b.parallel.sequence_parallel);
  if (compare_split) {
    EXPECT_EQ(a.parallel.layers_per_stage, b.parallel.layers_per_stage);
    EXPECT_EQ(a.parallel.first_stage_layers, b.parallel.first_stage_layers);
    EXPECT_EQ(a.parallel.last_stage_layers, b.parallel.last_stage_layers);
  }
  ASSERT_TRUE(a.train && b.train);
  EXPECT_EQ(a.train->micro_batch_size, b.train->micro_batch_size);
  EXPECT_EQ(a.train->global_batch_size, b.train->global_batch_size);
  EXPECT_EQ(a.train->seq_length, b.train->seq_length);
  EXPECT_EQ(a.train->num_microbatches, b.train->num_microbatches);
}

// ---- the Megatron round trips ----

TEST(ImportMegatron, MixtralExampleScriptMatchesTheExample) {
  MegatronImportOptions o;
  o.vocab_size = 32000;  // Llama2Tokenizer file: Mixtral's vocabulary (HF config vocab_size)
  o.name = "Mixtral-8x7B";
  auto d = import_megatron_file(sample("megatron_mixtral_8x7b.sh"), o);
  EXPECT_TRUE(d.report.not_understood.empty()) << d.to_toml();
  EXPECT_TRUE(reported(d.report.ignored, "--lr"));
  EXPECT_TRUE(reported(d.report.ignored, "--save")) << "paths from unset variables are ignored, not refused";
  const Scenario s = load_draft(d, "h100-dgx", 64);
  const Scenario ex = example("mixtral_8x7b_64gpu.toml");
  expect_same_model(s.model, ex.model);
  expect_same_layout(s, ex);
  EXPECT_EQ(s.train->exec.token_dispatcher, Dispatcher::alltoall);
  // --moe-grouped-gemm with Transformer Engine: TE's GroupedLinear, one cuBLAS GEMM per expert over 4 streams.
  EXPECT_EQ(s.train->exec.expert_execution, (ExpertExecution{ExpertExecutionKind::split, 4}));
  EXPECT_TRUE(s.train->use_distributed_optimizer);
  EXPECT_TRUE(s.train->overlap_grad_reduce);
  EXPECT_TRUE(s.train->overlap_param_gather);
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(s), megatron_flops_per_iteration(ex));
  EXPECT_EQ(s.run.cuda_device_max_connections, 1);  // the script's export CUDA_DEVICE_MAX_CONNECTIONS=1
}

TEST(ImportMegatron, Qwen3YamlMatchesTheExample) {
  MegatronImportOptions o;
  // runtime.conf's Qwen3-235B-A22B row (TP2 PP8 EP32 CP1 VPP4 MBS1, 96 / 8 / 4 layers per virtual
  // stage); GBS is a launch variable: the example's 1024.
  o.vars = {{"TP", "2"}, {"PP", "8"}, {"EP", "32"},      {"CP", "1"},       {"LAYERS_PER_VP", "3"},
            {"MBS", "1"}, {"GBS", "1024"}, {"SEQ_LEN", "4096"}, {"MOE_GROUPED_GEMM", "true"}};
  o.vocab_size = 151936;  // Qwen/Qwen3-235B-A22B tokenizer (HF config vocab_size)
  auto d = import_megatron_file(fixture("megatron_qwen3_235b.yaml"), o);
  // Paths and the run name come from variables the launcher sets: all of them are ignored flags.
  EXPECT_TRUE(d.report.not_understood.empty()) << d.to_toml();
  EXPECT_TRUE(reported(d.report.ignored, "ENV_VARS"));  // the others of its ENV_VARS
  EXPECT_TRUE(reported(d.report.ignored, "--manual-gc"));
  EXPECT_TRUE(reported(d.report.not_represented, "--make-vocab-size-divisible-by"));
  const Scenario s = load_draft(d, "h100-dgx", 256);
  const Scenario ex = example("qwen3_235b_256gpu.toml");
  expect_same_model(s.model, ex.model);
  expect_same_layout(s, ex);  // [2, 3 x 30, 2]: embedding and loss count as a layer
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(s), megatron_flops_per_iteration(ex));
}

TEST(ImportMegatron, DeepSeekV3RunMatchesTheExample) {
  MegatronImportOptions o;
  o.vocab_size = 129280;  // DeepSeek-V3 tokenizer (HF config vocab_size)
  // The published H100 run uses GBS 8192; the example keeps the technical report's 15360. FLOPs per
  // iteration scale with the batch, so the comparison sets the launch variable to the example's.
  o.vars = {{"GBS", "15360"}};
  auto d = import_megatron_file(fixture("megatron_deepseek_v3.sh"), o);
  EXPECT_TRUE(d.report.not_understood.empty()) << d.to_toml();
  EXPECT_FALSE(reported(d.report.not_represented, "--mtp-num-layers"));
  EXPECT_EQ(d.get("model", "mtp_num_layers"), Value(std::int64_t{1}));
  EXPECT_FALSE(reported(d.report.not_represented, "--overlap-moe-expert-parallel-comm"));
  // The parameter state's precision: fp8 weights, bf16 Adam moments (precision-aware optimizer),
  // fp32 main gradients and parameters as modelled.
  EXPECT_FALSE(reported(d.report.not_represented, "--fp8-param-gather"));
  EXPECT_TRUE(reported(d.report.ignored, "--main-grads-dtype"));
  const Scenario s = load_draft(d, "h100-dgx", 1024);
  EXPECT_TRUE(s.train->fp8_param_gather);
  EXPECT_EQ(s.train->exp_avg_dtype, scenarios::MomentDtype::bf16);
  EXPECT_EQ(s.train->exp_avg_sq_dtype, scenarios::MomentDtype::bf16);
  EXPECT_TRUE(s.train->grad_reduce_in_fp32);
  EXPECT_TRUE(s.train->overlap_moe_expert_parallel_comm);
  EXPECT_TRUE(s.train->delay_wgrad_compute);
  const Scenario ex = example("deepseek_v3_1024gpu.toml");
  expect_same_model(s.model, ex.model);
  EXPECT_EQ(s.model.moe_router_num_groups, 8);
  EXPECT_EQ(s.model.moe_router_group_topk, 4);
  // The published layout "Et|(tt|)*30mL" leaves the last virtual stage to the MTP layer and the loss
  // (the imported scenario's MTP depth runs there); the example has no MTP depth and gives that stage
  // one layer (its own split).
  expect_same_layout(s, ex, /*compare_split=*/false);
  std::vector<int> published(32, 2);
  published.front() = 1;
  published.back() = 0;
  EXPECT_EQ(s.parallel.layers_per_stage, published);
  EXPECT_EQ(s.train->exec.precision, Precision::fp8);
  // --fp8-recipe blockwise --fp8-format e4m3 (the benchmarking script's PR=fp8).
  EXPECT_EQ(s.train->exec.fp8_recipe, scenarios::Fp8Recipe::blockwise);
  EXPECT_EQ(s.train->exec.fp8_format, scenarios::Fp8Format::e4m3);
  EXPECT_FALSE(reported(d.report.not_represented, "--fp8-recipe"));
  EXPECT_TRUE(s.train->exec.fp8_recipe == scenarios::Fp8Recipe::blockwise);
  EXPECT_EQ(s.train->recompute_granularity, RecomputeGranularity::selective);
  EXPECT_EQ(s.train->recompute_modules, (std::vector<std::string>{"mla_up_proj", "mlp"}));
  Scenario ex_mtp = ex;  // the run's MTP depth, which the example leaves out
  ex_mtp.model.mtp_num_layers = 1;
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(s), megatron_flops_per_iteration(ex_mtp));
}

TEST(ImportMegatron, ScriptValuesWithoutOverridesArePublished) {
  MegatronImportOptions o;
  o.vocab_size = 129280;
  auto d = import_megatron_file(fixture("megatron_deepseek_v3.sh"), o);
  EXPECT_EQ(d.get("train", "global_batch_size"), Value(std::int64_t{8192}));
}

TEST(ImportMegatron, CommandLineFormWithUnknownAndUnresolvedArguments) {
  const std::vector<std::string> argv = {"--num-layers=4", "--hidden-size", "256", "--num-attention-heads", "4",
                                         "--vocab-size", "1000", "--seq-length", "128", "--micro-batch-size", "1",
                                         "--global-batch-size", "8", "--bf16", "--frobnicate", "3",
                                         "--tensor-model-parallel-size", "${TP}"};
  auto d = import_megatron(parse_megatron_argv(argv, {}), {});
  EXPECT_TRUE(reported(d.report.not_understood, "--frobnicate"));
  EXPECT_TRUE(reported(d.report.not_understood, "--tensor-model-parallel-size"));
  const std::string toml = d.to_toml();
  EXPECT_NE(toml.find("#   --frobnicate"), std::string::npos) << toml;
  // Megatron's defaults where they differ from the registry's are written, not assumed.
  EXPECT_EQ(d.get("model", "swiglu"), Value(false));
  EXPECT_EQ(d.get("model", "normalization"), Value("layernorm"));
  EXPECT_EQ(d.get("model", "ffn_hidden_size"), Value(std::int64_t{1024}));
  EXPECT_EQ(d.get("train", "use_distributed_optimizer"), Value(false));
  const Scenario s = load_draft(d, "h200-dgx", 8);
  EXPECT_EQ(s.parallel.dp, 8);
  EXPECT_EQ(s.cluster.gpu, GpuKind::h200);
}

TEST(ImportMegatron, Fp8RecipeAndFormatMapOneToOne) {
  const std::vector<std::string> base = {
      "--num-layers", "4",   "--hidden-size",      "256", "--num-attention-heads", "4", "--vocab-size", "1000",
      "--seq-length", "128", "--micro-batch-size", "1",   "--global-batch-size",   "8", "--bf16"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    return import_megatron(parse_megatron_argv(argv, {}), {});
  };
  // Megatron's default recipe is delayed scaling.
  auto d = with({"--fp8-format", "hybrid"});
  EXPECT_EQ(d.get("train", "precision"), Value("fp8"));
  EXPECT_EQ(d.get("train", "fp8_recipe"), Value("delayed"));
  EXPECT_EQ(d.get("train", "fp8_format"), Value("hybrid"));
  const Scenario s = load_draft(with({"--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"}), "h100-dgx", 8);
  EXPECT_EQ(s.train->exec.fp8_recipe, scenarios::Fp8Recipe::tensorwise);
  EXPECT_EQ(s.train->exec.fp8_format, scenarios::Fp8Format::e4m3);
  // mxfp8 is mapped as given; on a Hopper cluster the scenario's rule refuses it.
  auto mx = with({"--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"});
  EXPECT_EQ(mx.get("train", "fp8_recipe"), Value("mxfp8"));
  add_cluster_table(mx, "h100-dgx", 8);
  try {
    (void)load_scenario_text(mx.to_toml(), "imported.toml");
    FAIL() << "mxfp8 on H100 must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("[rule fp8-recipe]"), std::string::npos) << e.what();
  }
  // A user-supplied recipe is reported and modelled as delayed; unknown values name the allowed ones.
  auto c = with({"--fp8-format", "hybrid", "--fp8-recipe", "custom"});
  EXPECT_TRUE(reported(c.report.not_represented, "--fp8-recipe custom"));
  try {
    (void)with({"--fp8-format", "hybrid", "--fp8-recipe", "current"});
    FAIL() << "an unknown --fp8-recipe must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("allowed: delayed, tensorwise, blockwise, mxfp8"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(with({"--fp8-format", "e5m2"}), InputError);
  // Without fp8 the recipe is ignored, and said so.
  auto off = with({"--fp8-recipe", "tensorwise"});
  EXPECT_TRUE(reported(off.report.ignored, "--fp8-recipe"));
  EXPECT_FALSE(off.get("train", "fp8_recipe").has_value());
}

TEST(ImportMegatron, MegatronFsdpAndTorchFsdp2) {
  const std::vector<std::string> base = {"--num-layers",
                                         "4",
                                         "--hidden-size",
                                         "256",
                                         "--num-attention-heads",
                                         "4",
                                         "--vocab-size",
                                         "1000",
                                         "--seq-length",
                                         "128",
                                         "--micro-batch-size",
                                         "1",
                                         "--global-batch-size",
                                         "8",
                                         "--untie-embeddings-and-output-weights"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    return import_megatron(parse_megatron_argv(argv, {}), {});
  };
  // Megatron-FSDP: its default strategy, and it turns on the distributed optimizer.
  auto d = with({"--use-megatron-fsdp"});
  EXPECT_EQ(d.get("train", "data_parallel_sharding_strategy"), Value("optim_grads_params"));
  EXPECT_EQ(d.get("train", "use_distributed_optimizer"), Value(true));
  EXPECT_FALSE(reported(d.report.not_represented, "--use-megatron-fsdp"));
  const Scenario s = load_draft(d, "h100-dgx", 8);
  EXPECT_TRUE(s.train->shards_parameters());
  d = with({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads", "--use-distributed-optimizer"});
  EXPECT_EQ(d.get("train", "data_parallel_sharding_strategy"), Value("optim_grads"));
  EXPECT_THROW(with({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "zero3"}), InputError);
  // Without --use-megatron-fsdp the strategy does nothing.
  d = with({"--data-parallel-sharding-strategy", "optim"});
  EXPECT_TRUE(reported(d.report.ignored, "--data-parallel-sharding-strategy"));
  EXPECT_FALSE(d.get("train", "data_parallel_sharding_strategy").has_value());
  // PyTorch FSDP2 shards everything; Megatron refuses it with pipeline or expert parallelism.
  d = with({"--use-torch-fsdp2", "--torch-fsdp2-no-reshard-after-forward"});
  EXPECT_EQ(d.get("train", "data_parallel_sharding_strategy"), Value("optim_grads_params"));
  EXPECT_TRUE(reported(d.report.not_represented, "--torch-fsdp2-no-reshard-after-forward"));
  EXPECT_THROW(with({"--use-torch-fsdp2", "--pipeline-model-parallel-size", "2"}), InputError);
  EXPECT_THROW(with({"--use-torch-fsdp2", "--use-distributed-optimizer"}), InputError);
}

TEST(ImportMegatron, MoeLayerFreqExpressions) {
  EXPECT_EQ(expand_moe_layer_freq("2", 4), (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(expand_moe_layer_freq("'([0]*1+[1]*3)'", 4), (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(expand_moe_layer_freq("[0,1,0,1]", 4), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_THROW(expand_moe_layer_freq("([0]*3+[1]*57)", 61), InputError);  // wrong length
  EXPECT_THROW(expand_moe_layer_freq("[2]*4", 4), InputError);
  // A pattern first_dense_layers + moe_layer_freq cannot express is refused, not approximated.
  const std::vector<std::string> argv = {"--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                                         "--num-experts", "4", "--moe-layer-freq", "[1,1,0,1]"};
  EXPECT_THROW(import_megatron(parse_megatron_argv(argv, {}), {}), InputError);
}

// A small model's launch arguments plus `extra` (space-separated), imported.
ScenarioDraft import_small(const std::string& extra) {
  std::vector<std::string> argv = {"--num-layers", "8", "--hidden-size", "64", "--num-attention-heads", "4"};
  std::stringstream ss(extra);
  for (std::string w; ss >> w;) argv.push_back(w);
  return import_megatron(parse_megatron_argv(argv, {}), {});
}

// --window-attn-skip-freq N keeps layers N, 2N, ... (1-based) at full attention; a list marks the
// windowed layers with 1. Patterns model.window_attn_skip_freq expresses map to it; others are reported.
TEST(ImportMegatron, SlidingWindowFlagsMapToTheWindowKeys) {
  EXPECT_EQ(expand_window_attn_skip_freq("2", 4), (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(expand_window_attn_skip_freq("[1,1,1,0]*2", 8), (std::vector<int>{1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_THROW(expand_window_attn_skip_freq("[1,1,1]", 4), InputError);
  EXPECT_EQ(window_layers_of({1, 1, 1, 0, 1, 1, 1, 0}).skip_freq, std::optional<int>(4));
  EXPECT_EQ(window_layers_of({1, 1, 1, 1}).skip_freq, std::optional<int>(0));
  EXPECT_FALSE(window_layers_of({0, 0}).any);
  EXPECT_EQ(window_layers_of({0, 1, 1, 1}).skip_freq, std::nullopt);  // first layer full only: not expressible
  auto d = import_small("--window-size 127,0 --window-attn-skip-freq 4");
  EXPECT_EQ(d.get("model", "window_size"), Value(std::int64_t{128}));
  EXPECT_EQ(d.get("model", "window_attn_skip_freq"), Value(std::int64_t{4}));
  d = import_small("--window-size (511,0)");
  EXPECT_EQ(d.get("model", "window_size"), Value(std::int64_t{512}));
  EXPECT_EQ(d.get("model", "window_attn_skip_freq"), std::nullopt);
  d = import_small("--window-size -1,0");  // Transformer Engine's unbounded window
  EXPECT_EQ(d.get("model", "window_size"), std::nullopt);
  d = import_small("--window-size 127,0 --window-attn-skip-freq [0,1,1,1,1,1,1,1]");
  EXPECT_EQ(d.get("model", "window_size"), std::nullopt);
  EXPECT_TRUE(reported(d.report.not_represented, "--window-attn-skip-freq"));
  EXPECT_THROW(import_small("--window-size 127"), InputError);
  EXPECT_THROW(import_small("--window-size 12x,0"), InputError);
}

// transformers' sliding_window (keys per query, itself included) on the layers layer_types marks
// sliding_attention; without layer_types every layer (Mistral), or those from max_window_layers on
// (Qwen2 with use_sliding_window).
TEST(ImportHf, SlidingWindowConfigs) {
  const std::string head = R"({"architectures": ["MixtralForCausalLM"], "num_hidden_layers": 4,
      "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000,
      "intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2, )";
  auto d = import_hf_config(head + R"("sliding_window": 4096})", "mistral.json");
  EXPECT_EQ(d.get("model", "window_size"), Value(std::int64_t{4096}));
  EXPECT_EQ(d.get("model", "window_attn_skip_freq"), std::nullopt);
  d = import_hf_config(head + R"("sliding_window": null})", "mixtral.json");
  EXPECT_EQ(d.get("model", "window_size"), std::nullopt);
  d = import_hf_config(head + R"("sliding_window": 64, "layer_types": ["sliding_attention", "sliding_attention",
      "sliding_attention", "full_attention"]})",
                       "types.json");
  EXPECT_EQ(d.get("model", "window_size"), Value(std::int64_t{64}));
  EXPECT_EQ(d.get("model", "window_attn_skip_freq"), Value(std::int64_t{4}));
  d = import_hf_config(head + R"("sliding_window": 64, "use_sliding_window": true, "max_window_layers": 2})",
                       "qwen2.json");
  EXPECT_EQ(d.get("model", "window_size"), std::nullopt);  // layers 0-1 full, 2-3 windowed: not expressible
  EXPECT_TRUE(reported(d.report.not_represented, "sliding_window"));
  d = import_hf_config(head + R"("sliding_window": 64, "use_sliding_window": false})", "off.json");
  EXPECT_EQ(d.get("model", "window_size"), std::nullopt);
  EXPECT_THROW(import_hf_config(head + R"("sliding_window": 0})", "zero.json"), InputError);
  EXPECT_THROW(import_hf_config(head + R"("sliding_window": 64, "layer_types": ["sliding_attention"]})", "short.json"),
               InputError);
}

TEST(ImportMegatron, FirstLastLayersBf16NeedsFp8) {
  auto d = import_small(
      "--fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16 --num-layers-at-end-in-bf16 2");
  EXPECT_EQ(d.get("train", "first_last_layers_bf16"), Value(true));
  EXPECT_EQ(d.get("train", "num_layers_at_end_in_bf16"), Value(std::int64_t{2}));
  EXPECT_EQ(d.get("train", "num_layers_at_start_in_bf16"), std::nullopt);  // Megatron's default 1
  d = import_small("--bf16 --first-last-layers-bf16");
  EXPECT_EQ(d.get("train", "first_last_layers_bf16"), std::nullopt);
  EXPECT_TRUE(reported(d.report.ignored, "--first-last-layers-bf16"));
}

TEST(ImportMegatron, PipelineLayouts) {
  auto l = parse_pipeline_layout("Et*3|(tt|)*29m|L");
  EXPECT_EQ(l.layers_per_stage.size(), 32U);  // 1 + 29 + "m|" + "L"
  EXPECT_EQ(l.layers_per_stage.front(), 3);
  EXPECT_EQ(l.mtp_layers, 1);
  EXPECT_THROW(parse_pipeline_layout("Et|(tt|*3"), InputError);
  EXPECT_THROW(parse_pipeline_layout("Ex|L"), InputError);
}

// CUDA_DEVICE_MAX_CONNECTIONS, exported or set before the launch (or in a YAML recipe's ENV_VARS), is
// the scenario's run.cuda_device_max_connections; a value CUDA does not take is refused with its line.
TEST(ImportMegatron, TheLaunchsCudaDeviceMaxConnectionsIsTheRunsHardwareQueues) {
  const std::string flags =
      "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
      "--micro-batch-size 1 --global-batch-size 8 --vocab-size 1024 --bf16\n";
  auto queues = [](const ScenarioDraft& d) {
    const Scenario s = load_draft(d, "h100-dgx", 8);
    return s.run.cuda_device_max_connections;
  };
  EXPECT_EQ(
      queues(import_megatron(
          parse_megatron_launch("export CUDA_DEVICE_MAX_CONNECTIONS=1\ntorchrun pretrain_gpt.py " + flags, false, {}),
          {})),
      1);
  EXPECT_EQ(
      queues(import_megatron(
          parse_megatron_launch("CUDA_DEVICE_MAX_CONNECTIONS=32 torchrun pretrain_gpt.py " + flags, false, {}), {})),
      32);
  EXPECT_EQ(queues(import_megatron(parse_megatron_launch("torchrun pretrain_gpt.py " + flags, false, {}), {})), 8);
  const std::string yaml =
      "ENV_VARS:\n  CUDA_DEVICE_MAX_CONNECTIONS: 1\n  NCCL_ALGO: Ring\nMODEL_ARGS:\n  --num-layers: 2\n"
      "  --hidden-size: 64\n  --num-attention-heads: 4\n  --seq-length: 128\n"
      "  --micro-batch-size: 1\n  --global-batch-size: 8\n  --vocab-size: 1024\n  --bf16: true\n";
  const ScenarioDraft dy = import_megatron(parse_megatron_launch(yaml, true, {}), {});
  EXPECT_EQ(queues(dy), 1);
  ASSERT_TRUE(reported(dy.report.ignored, "ENV_VARS"));
  for (const auto& n : dy.report.ignored) {
    if (n.name == "ENV_VARS") {
      EXPECT_EQ(n.reason.rfind("1 environment variable", 0), 0U) << n.reason;
    }
  }
  MegatronImportOptions o;
  o.source = "launch.sh";
  for (const std::string bad : {"0", "33", "eight"}) {
    try {
      static_cast<void>(import_megatron(
          parse_megatron_launch("\nexport CUDA_DEVICE_MAX_CONNECTIONS=" + bad + "\ntorchrun pretrain_gpt.py " + flags,
                                false, {}),
          o));
      ADD_FAILURE() << bad << ": expected an InputError";
    } catch (const InputError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("launch.sh: line 2: CUDA_DEVICE_MAX_CONNECTIONS='" + bad + "'"), std::string::npos) << m;
      EXPECT_NE(m.find("from 1 to 32"), std::string::npos) << m;
    }
  }
}

TEST(ImportMegatron, ShellVariablesAndArithmetic) {
  const std::string script =
      "NUM_LAYERS=8\nPP=${PP:-2}\nextra=\"--num-layers-per-virtual-pipeline-stage $((NUM_LAYERS / PP / 2))\"\n"
      "python pretrain_gpt.py --num-layers $NUM_LAYERS \\\n  # a comment inside\n  --pipeline-model-parallel-size ${PP} \\\n"
      "  --wandb-exp-name \"x-${UNSET}\" --hidden-size=64 ${extra}\n";
  const auto args = parse_megatron_launch(script, false, {});
  std::map<std::string, std::vector<std::string>> by_flag;
  for (const auto& a : args) by_flag[a.flag] = a.values;
  EXPECT_EQ(by_flag["--num-layers"], std::vector<std::string>{"8"});
  EXPECT_EQ(by_flag["--pipeline-model-parallel-size"], std::vector<std::string>{"2"});
  EXPECT_EQ(by_flag["--hidden-size"], std::vector<std::string>{"64"});
  EXPECT_EQ(by_flag["--wandb-exp-name"], std::vector<std::string>{"x-${UNSET}"});
}

// ---- Hugging Face ----

TEST(ImportHf, DeepSeekV2LiteMatchesTheExampleModel) {
  auto d = import_hf_file(fixture("hf_deepseek_v2_lite.json"));
  EXPECT_TRUE(d.report.not_understood.empty()) << d.to_toml(true);
  d.set("model", "name", "DeepSeek-V2-Lite");
  d.set("parallel", "tp", 1);
  d.set("train", "micro_batch_size", 1);
  d.set("train", "global_batch_size", 8);
  d.set("train", "seq_length", 4096);
  const Scenario s = load_draft(d, "h100-dgx", 8);
  expect_same_model(s.model, example("deepseek_v2_lite_offload.toml").model);
}

TEST(ImportHf, MixtralMatchesTheExampleModel) {
  auto d = import_hf_file(sample("hf_mixtral_8x7b.json"));
  EXPECT_TRUE(d.report.not_understood.empty()) << d.to_toml(true);
  EXPECT_EQ(d.get("model", "position_embedding_type"), Value("rope"));
  EXPECT_FALSE(d.get("model", "qk_layernorm").has_value()) << "Mixtral has no QK norm";
  d.set("train", "micro_batch_size", 1);
  d.set("train", "global_batch_size", 256);
  d.set("train", "seq_length", 4096);
  d.set("parallel", "pp", 4);
  d.set("parallel", "ep", 8);
  const Scenario s = load_draft(d, "h100-dgx", 64);
  const Scenario ex = example("mixtral_8x7b_64gpu.toml");
  expect_same_model(s.model, ex.model);
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(s), megatron_flops_per_iteration(ex));
}

TEST(ImportHf, Qwen3_30B_A3B_Dimensions) {
  auto d = import_hf_file(sample("hf_qwen3_30b_a3b.json"));
  EXPECT_TRUE(d.report.not_understood.empty()) << d.to_toml(true);
  d.set("train", "micro_batch_size", 1);
  d.set("train", "global_batch_size", 8);
  d.set("train", "seq_length", 4096);
  const Scenario s = load_draft(d, "h100-dgx", 8);
  EXPECT_EQ(s.model.num_layers, 48);
  EXPECT_EQ(s.model.hidden_size, 2048);
  EXPECT_EQ(s.model.num_attention_heads, 32);
  EXPECT_EQ(s.model.attention, AttentionKind::gqa);
  EXPECT_EQ(s.model.num_query_groups, 4);
  EXPECT_EQ(s.model.kv_channels, 128);
  EXPECT_EQ(s.model.num_experts, 128);
  EXPECT_EQ(s.model.moe_router_topk, 8);
  EXPECT_EQ(s.model.moe_ffn_hidden_size, 768);
  EXPECT_EQ(s.model.first_dense_layers, 0);
  EXPECT_EQ(s.model.vocab_size, 151936);
  EXPECT_TRUE(s.model.untie_embeddings_and_output_weights);
  EXPECT_EQ(d.get("model", "position_embedding_type"), Value("rope"));
  EXPECT_EQ(d.get("model", "qk_layernorm"), Value(true));  // Qwen3's q_norm and k_norm per head
}

// Found by the importer mutation campaign (docs/fuzzing.md): a number too large for a double escaped
// as a raw JSON library exception; a duplicate key kept its last value.
TEST(ImportHf, NumbersOutOfRangeAndDuplicateKeysAreInputErrors) {
  const std::string head = R"({"architectures": ["MixtralForCausalLM"], "num_hidden_layers": 2, )";
  try {
    (void)import_hf_config(head + R"("rms_norm_eps": 1e309})", "big.json");
    FAIL() << "1e309 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("big.json: a number out of range"), std::string::npos) << e.what();
  }
  try {
    (void)import_hf_config(head + R"("num_hidden_layers": 4})", "dup.json");
    FAIL() << "duplicate key accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate key \"num_hidden_layers\""), std::string::npos) << e.what();
  }
}

TEST(ImportHf, QwenSparseStepAndDenseLlama) {
  auto d = import_hf_config(R"({"architectures": ["Qwen2MoeForCausalLM"], "num_hidden_layers": 6,
      "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000,
      "intermediate_size": 256, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 128,
      "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 2, "mlp_only_layers": []})",
                            "qwen2.json");
  EXPECT_EQ(d.get("model", "first_dense_layers"), Value(std::int64_t{1}));
  EXPECT_EQ(d.get("model", "moe_layer_freq"), Value(std::int64_t{2}));
  EXPECT_EQ(d.get("model", "moe_shared_expert_intermediate_size"), Value(std::int64_t{128}));
  EXPECT_EQ(d.get("model", "ffn_hidden_size"), Value(std::int64_t{256}));
  auto dense = import_hf_config(R"({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
      "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
      "intermediate_size": 256, "tie_word_embeddings": true, "some_new_field": 1})",
                                "llama.json");
  EXPECT_EQ(dense.get("model", "num_experts"), std::nullopt);
  EXPECT_EQ(dense.get("model", "untie_embeddings_and_output_weights"), Value(false));
  EXPECT_TRUE(reported(dense.report.not_understood, "some_new_field"));
}

TEST(ImportHf, UnknownArchitectureIsRefusedByName) {
  try {
    import_hf_config(R"({"architectures": ["FalconForCausalLM"], "model_type": "falcon"})", "falcon.json");
    FAIL() << "accepted an unknown architecture";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("FalconForCausalLM"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MixtralForCausalLM"), std::string::npos) << e.what();
  }
  EXPECT_THROW(import_hf_config("{not json", "bad.json"), InputError);
  EXPECT_THROW(import_hf_config(R"({"architectures": ["MixtralForCausalLM"], "num_hidden_layers": "32"})", "m.json"),
               InputError);
}

// ---- clusters ----

TEST(ImportCluster, PresetsAndGpus) {
  EXPECT_EQ(cluster_preset_names(), (std::vector<std::string>{"h100-dgx", "h200-dgx"}));
  ScenarioDraft d;
  add_cluster_table(d, "h100-dgx", 16);
  EXPECT_EQ(d.get("cluster", "nodes"), Value(std::int64_t{2}));
  EXPECT_EQ(d.get("cluster", "nic_bandwidth"), Value(50e9));       // "400Gbps", read by the loader's rules
  EXPECT_THROW(add_cluster_table(d, "h100-dgx", 12), InputError);  // not a multiple of 8
  try {
    add_cluster_table(d, "h100-dxg", 8);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'h100-dgx'"), std::string::npos) << e.what();
  }
  // A scenario file's [cluster] table.
  ScenarioDraft from_example;
  add_cluster_table(from_example, (testing::source_dir() / "scenarios/examples/mixtral_8x7b_64gpu.toml").string(),
                    std::nullopt);
  EXPECT_EQ(from_example.get("cluster", "nodes"), Value(std::int64_t{8}));
  EXPECT_NE(from_example.to_toml().find("[cluster]\n"), std::string::npos) << from_example.to_toml();
}

TEST(ImportCluster, UnknownKeysAndBadValuesOfAClusterFileAreErrorsWithTheirLine) {
  const auto dir = std::filesystem::temp_directory_path() / "threewalls_import_cluster_test";
  std::filesystem::create_directories(dir);
  const auto file = (dir / "c.toml").string();
  { std::ofstream(file) << "[cluster]\ngpu = \"h100\"\ngpus_per_node = 8\nnic_bandwith = \"400Gbps\"\n"; }
  ScenarioDraft d;
  try {
    add_cluster_table(d, file, 16);
    FAIL() << "accepted an unknown key";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(file + ":4:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("did you mean 'nic_bandwidth'"), std::string::npos) << e.what();
  }
  { std::ofstream(file) << "[cluster]\ngpu = \"h100\"\ngpus_per_node = 8\nnic_bandwidth = 400\n"; }
  try {
    add_cluster_table(d, file, 16);
    FAIL() << "accepted a bandwidth without a unit";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(file + ":4:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("needs a unit"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// ---- the CLI ----

TEST(ImportCli, WritesValidScenarioAndRefusesOverwrite) {
  testing::TempDir tmp;
  const auto out = tmp.path() / "mixtral.toml";
  const std::string cmd = std::string(THREEWALLS_CLI_PATH) + " import megatron " +
                          testing::shell_quote(sample("megatron_mixtral_8x7b.sh").string()) +
                          " --vocab-size 32000 --cluster h100-dgx --gpus 64 --out " +
                          testing::shell_quote(out.string());
  auto r = testing::run_command(cmd, true);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(" --lr, "), std::string::npos) << r.out;  // grouped by reason on one "ignored:" line
  EXPECT_NO_THROW(load_scenario(out));
  r = testing::run_command(cmd, true);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("pass --overwrite"), std::string::npos) << r.out;
  EXPECT_EQ(testing::run_command(cmd + " --overwrite", true).exit_code, 0);
  // The older name still works and says it is deprecated.
  r = testing::run_command(cmd + " --force", true);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("--force is deprecated; use --overwrite"), std::string::npos) << r.out;
}

TEST(ImportCli, StrictRefusesUnknownArguments) {
  const std::string base = std::string(THREEWALLS_CLI_PATH) +
                           " import megatron --model-only --strict -- --num-layers 2 --hidden-size 64 "
                           "--num-attention-heads 4 --vocab-size 100 --frobnicate";
  auto r = testing::run_command(base, true);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("not understood: --frobnicate"), std::string::npos) << r.out;
}

TEST(ImportCli, InvalidResultPrintsTheValidatorsErrors) {
  // ep = 3 does not divide 8 experts: the validator's rule is printed, exit 2.
  const std::string cmd = std::string(THREEWALLS_CLI_PATH) + " import hf " +
                          testing::shell_quote(sample("hf_mixtral_8x7b.json").string()) +
                          " --cluster h100-dgx --gpus 24 --ep 3 --seq-length 4096 --global-batch-size 24";
  auto r = testing::run_command(cmd, true);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("does not validate"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rule "), std::string::npos) << r.out;
  const auto model_only = testing::run_command(std::string(THREEWALLS_CLI_PATH) + " import hf --model-only " +
                                                   testing::shell_quote(sample("hf_qwen3_30b_a3b.json").string()),
                                               false);
  EXPECT_EQ(model_only.exit_code, 0);
  EXPECT_NE(model_only.out.find("[model]"), std::string::npos);
  EXPECT_EQ(model_only.out.find("[cluster]"), std::string::npos);
}

}  // namespace
}  // namespace threewalls::scenarios

namespace threewalls::scenarios {
namespace {

// A file without a single Megatron argument (here a config.json) is refused, not imported as an
// empty launch, and the message points to `import hf`.
TEST(ImportMegatron, FileWithoutArgumentsIsRefused) {
  try {
    static_cast<void>(import_megatron_file(sample("hf_mixtral_8x7b.json"), {}));
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no Megatron-LM argument found"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("import hf"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace threewalls::scenarios

// Importer bounds: nesting is limited (no stack overflow), time is linear in the input, arithmetic
// errors are named, and every accepted value goes through the scenario checks.
namespace threewalls::scenarios {
namespace {

std::string import_error(const std::string& script) {
  try {
    static_cast<void>(parse_megatron_launch(script, false, {}));
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ImportMegatron, DeeplyNestedArithmeticIsAnErrorNotAStackOverflow) {
  const std::string deep = "X=$((" + std::string(20000, '(') + "1" + std::string(20000, ')') + "))\n--num-layers $X\n";
  const std::string err = import_error(deep);
  EXPECT_NE(err.find("line 1: $(("), std::string::npos) << err.substr(0, 200);
  EXPECT_NE(err.find("parentheses nested more than 200 deep"), std::string::npos) << err.substr(0, 200);
  // Nesting within the limit still evaluates.
  const auto args = parse_megatron_launch(
      "python x.py --num-layers $((" + std::string(50, '(') + "6" + std::string(50, ')') + "))\n", false, {});
  ASSERT_EQ(args.size(), 1U);
  EXPECT_EQ(args[0].values, std::vector<std::string>{"6"});
}

TEST(ImportMegatron, NestedDefaultsAreBounded) {
  std::string ref = "1";
  for (int i = 0; i < 1000; ++i) ref = "${U" + std::to_string(i) + ":-" + ref + "}";
  const std::string err = import_error("python x.py --num-layers " + ref + "\n");
  EXPECT_NE(err.find("nested more than 200 deep"), std::string::npos) << err.substr(0, 200);
}

TEST(ImportMegatron, DivisionByZeroAndOverflowAreNamed) {
  EXPECT_NE(import_error("python x.py --num-layers $((4/0))\n").find("line 1: $((4/0)): division by zero"),
            std::string::npos)
      << import_error("python x.py --num-layers $((4/0))\n");
  EXPECT_NE(import_error("A=$((9223372036854775807 + 1))\n").find("overflows 64 bits"), std::string::npos);
  EXPECT_NE(import_error("A=$((4294967296 * 4294967296))\n").find("overflows 64 bits"), std::string::npos);
}

TEST(ImportMegatron, ManyVariableLinesParseInLinearTime) {
  // 20,000 assignments, each using the previous one: once quadratic or worse (79 s); now well under
  // a second of work, checked with a generous bound for loaded machines.
  std::string script;
  for (int i = 0; i < 20000; ++i) {
    script += "V" + std::to_string(i) + "=" + (i == 0 ? std::string("1") : "$V" + std::to_string(i - 1)) + "\n";
  }
  script += "python x.py --num-layers $V19999\n";
  const auto t0 = std::chrono::steady_clock::now();
  const auto args = parse_megatron_launch(script, false, {});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(args.size(), 1U);
  EXPECT_EQ(args[0].values, std::vector<std::string>{"1"});
  EXPECT_LT(s, 10.0);
}

TEST(ImportCli, ModelOnlyValuesAreChecked) {
  testing::TempDir tmp;
  const auto cfg = tmp.path() / "config.json";
  std::ofstream(cfg) << R"({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
    "num_attention_heads": 0, "intermediate_size": 128, "vocab_size": 100})";
  const auto r = testing::run_command(std::string(THREEWALLS_CLI_PATH) + " import hf --model-only " +
                                          testing::shell_quote(cfg.string()) + " --out " +
                                          testing::shell_quote((tmp.path() / "m.toml").string()),
                                      true);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("'num_attention_heads' = 0 is out of range"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("(valid)"), std::string::npos) << r.out;
}

TEST(ImportCli, NonRegularInputsAreRefused) {
  const auto r = testing::run_command(std::string(THREEWALLS_CLI_PATH) + " import hf --model-only /dev/zero", true);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("/dev/zero: cannot read Hugging Face config (not a regular file"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace threewalls::scenarios
