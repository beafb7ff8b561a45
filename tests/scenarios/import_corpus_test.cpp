// threewalls import on real public files (tests/scenarios/fixtures/import_corpus/, sources and
// licences in its SOURCES.md): each file imports to the model it describes, with every argument or
// field mapped, ignored with a reason or reported as not represented (none "not understood"), or is
// refused with a message naming the unsupported feature.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/import.hpp"

namespace threewalls::scenarios {
namespace {

std::filesystem::path corpus(const std::string& name) {
  return testing::source_dir() / "tests/scenarios/fixtures/import_corpus" / name;
}

Value integer(std::int64_t v) { return Value(v); }

bool reported(const std::vector<ImportNote>& notes, const std::string& name) {
  return std::any_of(notes.begin(), notes.end(),
                     [&](const ImportNote& n) { return n.name.find(name) != std::string::npos; });
}

std::string listed(const std::vector<ImportNote>& notes) {
  std::string out;
  for (const auto& n : notes) out += "\n  " + n.name + ": " + n.reason;
  return out;
}

ScenarioDraft megatron_file(const std::filesystem::path& path) {
  MegatronImportOptions o;
  o.vocab_size = 32000;  // the launches name tokenizer files; those with a size keep theirs (checked below)
  return import_megatron_file(path, o);
}

ScenarioDraft megatron(const std::string& name) { return megatron_file(corpus("megatron/" + name)); }

// The model of a file: every registry key named here has the value given.
void expect_model(const ScenarioDraft& d, const std::vector<std::pair<std::string, Value>>& model) {
  for (const auto& [key, value] : model) EXPECT_EQ(d.get("model", key), value) << "model." << key;
  EXPECT_TRUE(d.report.not_understood.empty()) << "not understood:" << listed(d.report.not_understood);
}

TEST(ImportCorpus, MixtralExampleScriptWithBashArrays) {
  // The corpus's Mixtral launch is the shipped sample input (SOURCES.md): one copy, read there.
  const auto d = megatron_file(testing::source_dir() / "scenarios/inputs/megatron_mixtral_8x7b.sh");
  expect_model(d, {{"num_layers", integer(32)},
                   {"hidden_size", integer(4096)},
                   {"num_attention_heads", integer(32)},
                   {"attention", Value("gqa")},
                   {"num_query_groups", integer(8)},
                   {"num_experts", integer(8)},
                   {"moe_router_topk", integer(2)},
                   {"swiglu", Value(true)}});
  EXPECT_EQ(d.get("parallel", "ep"), integer(8));
}

TEST(ImportCorpus, QuotedModelArgsStringImports) {
  const auto d = megatron("modelopt_Qwen3-30B-A3B.sh");
  expect_model(d, {{"num_layers", integer(48)},
                   {"hidden_size", integer(2048)},
                   {"num_attention_heads", integer(32)},
                   {"attention", Value("gqa")},
                   {"num_query_groups", integer(4)},
                   {"kv_channels", integer(128)},
                   {"num_experts", integer(128)},
                   {"moe_router_topk", integer(8)},
                   {"moe_ffn_hidden_size", integer(768)},
                   {"swiglu", Value(true)}});
}

TEST(ImportCorpus, GptOssQuickGegluIsAGatedMlpAndTheWindowIsMapped) {
  const auto d = megatron("modelopt_gpt-oss-20b.sh");
  expect_model(d, {{"num_layers", integer(24)},
                   {"hidden_size", integer(2880)},
                   {"num_attention_heads", integer(64)},
                   {"num_query_groups", integer(8)},
                   {"kv_channels", integer(64)},
                   {"num_experts", integer(32)},
                   {"moe_router_topk", integer(4)},
                   {"moe_ffn_hidden_size", integer(2880)},
                   {"swiglu", Value(true)},
                   // --window-size 127,0: 127 keys before each query and itself; --window-attn-skip-freq 2:
                   // layers 2, 4, ... (1-based) keep full attention.
                   {"window_size", integer(128)},
                   {"window_attn_skip_freq", integer(2)}});
  EXPECT_FALSE(reported(d.report.not_represented, "--window-size")) << listed(d.report.not_represented);
  EXPECT_TRUE(reported(d.report.not_represented, "--softmax-type")) << listed(d.report.not_represented);
}

TEST(ImportCorpus, GptOssTrainingExampleWithCaseParsingAndQuotedArrayElements) {
  const auto d = megatron("gptoss_02_train.sh");
  expect_model(d, {{"num_layers", integer(12)},
                   {"hidden_size", integer(512)},
                   {"num_attention_heads", integer(64)},
                   {"num_query_groups", integer(8)},
                   {"num_experts", integer(4)},
                   {"moe_router_topk", integer(2)},
                   {"moe_ffn_hidden_size", integer(2048)},
                   {"swiglu", Value(true)}});
}

TEST(ImportCorpus, Llama3Fp8ExampleIsDense) {
  const auto d = megatron("llama_train_llama3_8b_h100_fp8.sh");
  expect_model(d, {{"num_layers", integer(32)},
                   {"hidden_size", integer(4096)},
                   {"num_attention_heads", integer(32)},
                   {"num_query_groups", integer(8)},
                   {"ffn_hidden_size", integer(14336)},
                   {"swiglu", Value(true)}});
  EXPECT_FALSE(d.get("model", "num_experts").has_value());
}

TEST(ImportCorpus, SbatchHeredocWithSrunFlagsAndMegatronFsdp) {
  const auto d = megatron("megatron_fsdp_sbatch_mfsdp_deepseek_v3.sh");
  expect_model(d, {{"num_layers", integer(61)},
                   {"hidden_size", integer(7168)},
                   {"attention", Value("mla")},
                   {"num_experts", integer(256)},
                   {"moe_router_topk", integer(8)},
                   {"moe_router_num_groups", integer(8)},
                   {"moe_router_group_topk", integer(4)}});
  // Megatron-FSDP is mapped: the script's ${SHARDING_STRATEGY:-"optim_grads_params"}.
  EXPECT_FALSE(reported(d.report.not_represented, "--use-megatron-fsdp")) << listed(d.report.not_represented);
  EXPECT_EQ(d.get("train", "data_parallel_sharding_strategy"), Value("optim_grads_params"));
  EXPECT_TRUE(reported(d.report.ignored, "srun")) << listed(d.report.ignored);
}

TEST(ImportCorpus, YamlRecipe) {
  const auto d = megatron("gptoss_20b_swa_inference_model_config.yaml");
  expect_model(d, {{"num_layers", integer(24)},
                   {"hidden_size", integer(2880)},
                   {"num_experts", integer(32)},
                   {"moe_router_topk", integer(4)},
                   {"swiglu", Value(true)},
                   {"window_size", integer(128)},  // "--window-size: 127,0"
                   {"window_attn_skip_freq", integer(2)}});
}

TEST(ImportCorpus, OlmoeConfig) {
  const auto d = import_hf_file(corpus("hf/olmoe_1b_7b.json"));
  expect_model(d, {{"name", Value("OlmoeForCausalLM")},
                   {"num_layers", integer(16)},
                   {"hidden_size", integer(2048)},
                   {"num_attention_heads", integer(16)},
                   {"num_experts", integer(64)},
                   {"moe_router_topk", integer(8)},
                   {"moe_ffn_hidden_size", integer(1024)},
                   {"vocab_size", integer(50304)},
                   {"position_embedding_type", Value("rope")},
                   {"qk_layernorm", Value(true)}});
  EXPECT_TRUE(reported(d.report.not_represented, "q_norm, k_norm")) << listed(d.report.not_represented);
}

TEST(ImportCorpus, DeepSeekV3ConfigMapsGroupLimitedRoutingAndReportsItsQuantization) {
  const auto d = import_hf_file(corpus("hf/deepseek_v3.json"));
  expect_model(d, {{"num_layers", integer(61)},
                   {"attention", Value("mla")},
                   {"num_experts", integer(256)},
                   {"moe_router_topk", integer(8)},
                   {"moe_router_num_groups", integer(8)},
                   {"moe_router_group_topk", integer(4)},
                   {"first_dense_layers", integer(3)},
                   {"moe_shared_expert_intermediate_size", integer(2048)},
                   {"position_embedding_type", Value("rope")},
                   {"mtp_num_layers", integer(1)}});  // num_nextn_predict_layers
  EXPECT_FALSE(d.get("model", "qk_layernorm").has_value()) << "MLA has no per-head QK norm";
  EXPECT_TRUE(reported(d.report.not_represented, "quantization_config")) << listed(d.report.not_represented);
}

TEST(ImportCorpus, GptOssConfigMapsItsSlidingWindowAndReportsMxfp4AndSinks) {
  const auto d = import_hf_file(corpus("hf/gpt_oss_20b.json"));
  expect_model(d, {{"name", Value("GptOssForCausalLM")},
                   {"num_layers", integer(24)},
                   {"hidden_size", integer(2880)},
                   {"num_attention_heads", integer(64)},
                   {"attention", Value("gqa")},
                   {"num_query_groups", integer(8)},
                   {"kv_channels", integer(64)},
                   {"num_experts", integer(32)},
                   {"moe_router_topk", integer(4)},
                   {"moe_ffn_hidden_size", integer(2880)},
                   {"swiglu", Value(true)},
                   {"vocab_size", integer(201088)},
                   // layer_types alternates sliding_attention (layers 0, 2, ...) and full_attention.
                   {"window_size", integer(128)},
                   {"window_attn_skip_freq", integer(2)}});
  for (const char* feature : {"quantization_config", "sinks"}) {
    EXPECT_TRUE(reported(d.report.not_represented, feature)) << feature << listed(d.report.not_represented);
  }
  EXPECT_FALSE(reported(d.report.not_represented, "sliding_window")) << listed(d.report.not_represented);
}

// The fixture spells one key "tie_word_embedding" (the published config.json has
// "tie_word_embeddings"): it is reported as not understood, not silently dropped.
TEST(ImportCorpus, DeepSeekMoeConfigByModelType) {
  const auto d = import_hf_file(corpus("hf/deepseek_moe_16b.json"));
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, Value>>{{"name", Value("DeepseekForCausalLM")},
                                                  {"num_layers", integer(28)},
                                                  {"hidden_size", integer(2048)},
                                                  {"num_attention_heads", integer(16)},
                                                  {"num_experts", integer(64)},
                                                  {"moe_router_topk", integer(6)},
                                                  {"moe_ffn_hidden_size", integer(1408)},
                                                  {"moe_shared_expert_intermediate_size", integer(2 * 1408)},
                                                  {"first_dense_layers", integer(1)},
                                                  {"ffn_hidden_size", integer(10944)},
                                                  {"vocab_size", integer(102400)}}) {
    EXPECT_EQ(d.get("model", key), value) << "model." << key;
  }
  ASSERT_EQ(d.report.not_understood.size(), 1U) << listed(d.report.not_understood);
  EXPECT_EQ(d.report.not_understood.front().name, "tie_word_embedding");
}

TEST(ImportCorpus, Qwen3NextLinearAttentionIsRefusedByName) {
  try {
    (void)import_hf_file(corpus("hf/qwen3_next_80b_a3b.json"));
    FAIL() << "Qwen3-Next imported";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("linear-attention"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Qwen3NextForCausalLM"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace threewalls::scenarios
