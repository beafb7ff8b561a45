// The registry writes scenarios (writer.hpp): a written scenario loads back to the same Scenario,
// for every shipped example and validation scenario and for values of every key type.
#include <filesystem>

#include <gtest/gtest.h>

#include "test_support.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/registry.hpp"
#include "threewalls/scenarios/writer.hpp"

namespace threewalls::scenarios {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> shipped_scenarios() {
  std::vector<fs::path> out = testing::toml_files(testing::source_dir() / "scenarios/examples");
  for (const auto& e : fs::recursive_directory_iterator(testing::source_dir() / "scenarios/validation")) {
    if (e.is_regular_file() && e.path().extension() == ".toml") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Loads `text` as if it were the file `like` (same folder), with the provenance of `original`, so two
// scenarios compare on what the file says. A calibration profile path compares as the file it names.
Scenario reload(const std::string& text, const Scenario& original) {
  Scenario s = load_scenario_text(text, original.source_path).scenario;
  s.source_path = original.source_path;
  s.content_hash = original.content_hash;
  return s;
}

std::string profile_file(const Scenario& s) {
  if (s.calibration_profile == "auto") return s.calibration_profile;
  return fs::weakly_canonical(s.calibration_profile).string();
}

class ShippedScenario : public ::testing::TestWithParam<fs::path> {};

TEST_P(ShippedScenario, WrittenScenarioReloadsToTheSameScenario) {
  Scenario original = load_scenario(GetParam());
  const std::string text = write_scenario(original);
  Scenario again;
  try {
    again = reload(text, original);
  } catch (const ScenarioError& e) {
    FAIL() << e.what() << "\n--- written:\n" << text;
  }
  EXPECT_EQ(profile_file(again), profile_file(original));
  again.calibration_profile = original.calibration_profile;
  EXPECT_TRUE(again == original) << text;
  // Writing is a fixed point: the reloaded scenario writes the same text.
  EXPECT_EQ(write_scenario(load_scenario_text(text, original.source_path).scenario), text);
}

INSTANTIATE_TEST_SUITE_P(Files, ShippedScenario, ::testing::ValuesIn(shipped_scenarios()),
                         [](const ::testing::TestParamInfo<fs::path>& p) {
                           std::string name = p.param.parent_path().filename().string() + "_" + p.param.stem().string();
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

TEST(ScenarioWriter, CoversExamplesAndValidationScenarios) { EXPECT_GE(shipped_scenarios().size(), 60U); }

TEST(ScenarioWriter, EveryParamHasAGetter) {
  for (const auto& p : Registry::instance().params()) EXPECT_TRUE(static_cast<bool>(p.get)) << p.path;
}

const char* kCluster = R"(
[cluster]
gpu = "h100"
gpus_per_node = 2
nodes = 1
)";

// A scenario: the top level and [model] keys, `model_rest` more [model] keys, then `tables`.
std::string scenario(const std::string& model_rest, const std::string& tables) {
  return std::string(R"(schema_version = 1
[model]
num_layers = 4
hidden_size = 256
num_attention_heads = 4
vocab_size = 1000
ffn_hidden_size = 512
)") + model_rest +
         kCluster + tables;
}

TEST(ScenarioWriter, KeysAtTheirDefaultAreLeftOutAndDerivedOnesKept) {
  const Scenario s =
      load_scenario_text(scenario("", "[train]\nmicro_batch_size = 1\nglobal_batch_size = 2\nseq_length = 128\n"),
                         "/tmp/x.toml")
          .scenario;
  const std::string text = write_scenario(s, {"made by a test", "second line"});
  EXPECT_EQ(text.rfind("# made by a test\n# second line\nschema_version = 1\nname = \"x\"\n", 0), 0U) << text;
  EXPECT_EQ(text.find("tp ="), std::string::npos) << text;              // default 1
  EXPECT_NE(text.find("nvlink_bandwidth = \"450GBps\"\n"), std::string::npos) << text;  // derived: written
  EXPECT_NE(text.find("dp = 2\n"), std::string::npos) << text;          // derived: written
  EXPECT_NE(text.find("gpu_memory = \"79.6GiB\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kv_channels = 64\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("num_query_groups"), std::string::npos) << text;  // mha derives it
  EXPECT_EQ(text.find("[run"), std::string::npos) << text;              // every [run] key at its default
  EXPECT_EQ(text.find("[calibration]"), std::string::npos) << text;
}

TEST(ScenarioWriter, ValuesOfEveryKindRoundTrip) {
  const std::string text = std::string(R"(schema_version = 1
name = "odd \"name\"\twith\\escapes"
description = "two\nlines"
[model]
num_layers = 6
hidden_size = 256
num_attention_heads = 4
num_query_groups = 2
attention = "gqa"
vocab_size = 1000
ffn_hidden_size = 512
num_experts = 4
moe_ffn_hidden_size = 128
moe_router_topk = 2
first_dense_layers = 1
moe_layer_freq = 2
[parallel]
pp = 2
vpp = 3
ep = 2
layers_per_stage = [1, 1, 1, 1, 1, 1]
[train]
micro_batch_size = 1
global_batch_size = 8
seq_length = 128
recompute_granularity = "selective"
recompute_modules = ["moe_act", "layernorm"]
expert_execution = "streams:2"
cuda_graph_scope = ["attn", "moe_router"]
routing_imbalance = 1.37
grad_bucket_size = 1.5e7
[cluster]
gpu = "h200"
gpus_per_node = 2
nodes = 2
gpu_memory = "1.5GB"
nvlink_bandwidth = "123.456GBps"
nic_bandwidth = "200Gbps"
nic_latency = "2.5us"
switch_latency = "700ns"
oversubscription = 3.0
[[cluster.slowdown]]
rank = 1
factor = 1.25
link = "nic"
[[cluster.slowdown]]
rank = 3
factor = 2
from_step = 1
to_step = 2
[run]
steps = 4
seed = 9000000000
[run.profiler]
ranks = [0, 3]
granularity = "coarse"
)");
  const Scenario s = load_scenario_text(text, "/tmp/kinds.toml").scenario;
  const std::string written = write_scenario(s);
  Scenario again = load_scenario_text(written, "/tmp/kinds.toml").scenario;
  again.content_hash = s.content_hash;
  EXPECT_TRUE(again == s) << written;
  EXPECT_NE(written.find("[[cluster.slowdown]]\nrank = 1\nfactor = 1.25\nlink = \"nic\"\n"), std::string::npos)
      << written;
  EXPECT_NE(written.find("nic_bandwidth = \"200Gbps\"\n"), std::string::npos) << written;  // its default's unit
  EXPECT_NE(written.find("switch_latency = \"700ns\"\n"), std::string::npos) << written;
  EXPECT_NE(written.find("seed = 9000000000\n"), std::string::npos) << written;
  EXPECT_NE(written.find("name = \"odd \\\"name\\\"\\twith\\\\escapes\"\n"), std::string::npos) << written;
}

TEST(ScenarioWriter, InferenceWithOffloadAndRepresentativesRoundTrips) {
  const std::string text = scenario(R"(num_experts = 4
moe_ffn_hidden_size = 128
moe_router_topk = 2
)",
                                    R"([parallel]
ep = 2
[infer]
batch_size = 2
prompt_length = 64
generate_tokens = 8
kv_cache_precision = "fp8"
routing_skew = 0.3
[infer.expert_offload]
tier = "host_pinned"
cache_experts_per_layer = 1
prefetch = "next_layer"
[run.profiler]
ranks = "representatives"
)");
  const Scenario s = load_scenario_text(text, "/tmp/inf.toml").scenario;
  const std::string written = write_scenario(s);
  Scenario again = load_scenario_text(written, "/tmp/inf.toml").scenario;
  again.content_hash = s.content_hash;
  EXPECT_TRUE(again == s) << written;
  EXPECT_NE(written.find("[infer.expert_offload]\ntier = \"host_pinned\"\n"), std::string::npos) << written;
}

TEST(ScenarioWriter, MlaWritesItsDimensionsEvenAtZeroAndNoHeadGroups) {
  const std::string text = scenario(R"(attention = "mla"
kv_lora_rank = 64
qk_head_dim = 32
qk_pos_emb_head_dim = 0
v_head_dim = 32
)",
                                    R"([train]
micro_batch_size = 1
global_batch_size = 2
seq_length = 128
)");
  const Scenario s = load_scenario_text(text, "/tmp/mla.toml").scenario;
  const std::string written = write_scenario(s);
  EXPECT_NE(written.find("qk_pos_emb_head_dim = 0\n"), std::string::npos) << written;
  EXPECT_EQ(written.find("num_query_groups"), std::string::npos) << written;
  EXPECT_EQ(written.find("kv_channels"), std::string::npos) << written;
  Scenario again = load_scenario_text(written, "/tmp/mla.toml").scenario;
  again.content_hash = s.content_hash;
  EXPECT_TRUE(again == s) << written;
}

TEST(ScenarioWriter, QuantitiesAreWrittenInUnitsThatReadBackExactly) {
  const Registry& reg = Registry::instance();
  const ParamSpec& mem = *reg.find_param("cluster.gpu_memory");
  const ParamSpec& bw = *reg.find_param("cluster.nvlink_bandwidth");
  const ParamSpec& nic = *reg.find_param("cluster.nic_bandwidth");
  const ParamSpec& lat = *reg.find_param("cluster.nic_latency");
  EXPECT_EQ(toml_literal(mem, gibibytes(79.6).value), "\"79.6GiB\"");
  EXPECT_EQ(toml_literal(mem, 80e9), "\"80GB\"");
  EXPECT_EQ(toml_literal(mem, 12345.0), "\"12345B\"");
  EXPECT_EQ(toml_literal(bw, 50e9), "\"50GBps\"");
  EXPECT_EQ(toml_literal(nic, 50e9), "\"400Gbps\"");  // in the unit of the key's default when exact
  EXPECT_EQ(toml_literal(lat, 1e-6), "\"1us\"");
  for (const double v : {1.0 / 3.0, 2.5e-7, 7e-9, 123456.789e-6}) {
    const std::string literal = toml_literal(lat, v);
    EXPECT_EQ(std::get<double>(parse_literal(lat, literal, {"<test>", 1, 1})), v) << literal;
  }
  for (const double v : {1.0 / 3.0 * 1e9, 85469531750.4, 3221225475.0}) {  // within the key's range (1 MiB to 1 PiB)
    const std::string literal = toml_literal(mem, v);
    EXPECT_EQ(std::get<double>(parse_literal(mem, literal, {"<test>", 1, 1})), v) << literal;
  }
  const ParamSpec& real = *reg.find_param("infer.routing_skew");
  EXPECT_EQ(toml_literal(real, 40000000.0), "40000000");
  EXPECT_EQ(toml_literal(real, std::int64_t{3}), "3");
  EXPECT_EQ(toml_literal(real, 1e-20), "1e-20");
  EXPECT_EQ(std::get<double>(parse_literal(real, toml_literal(real, 0.1 + 0.2), {"<test>", 1, 1})), 0.1 + 0.2);
}

TEST(ScenarioText, RefusesKeysOutsideTheRegistryAndValuesOfAnotherType) {
  ScenarioText t;
  EXPECT_THROW(t.set("model", "num_layer", std::int64_t{2}), std::logic_error);
  EXPECT_THROW(t.set("model", "num_layers", std::string("2")), std::logic_error);
  EXPECT_THROW(t.add_element("model"), std::logic_error);
  t.set("model", "num_layers", std::int64_t{2});
  t.set("train", "grad_bucket_size", std::int64_t{5});  // an integer for a number key is widened
  EXPECT_EQ(t.get("train", "grad_bucket_size"), Value(5.0));
  t.set("model", "num_layers", std::int64_t{3});
  EXPECT_EQ(t.to_toml(), "[model]\nnum_layers = 3\n\n[train]\ngrad_bucket_size = 5\n");
  EXPECT_EQ(t.to_toml("train"), "[train]\ngrad_bucket_size = 5\n");
  t.erase("model", "num_layers");
  EXPECT_EQ(t.get("model", "num_layers"), std::nullopt);
  EXPECT_TRUE(t.has_table("model"));
}

TEST(ScenarioWriter, EnumNamesAreTheRegistryChoices) {
  EXPECT_STREQ(to_string(Precision::fp8), "fp8");
  EXPECT_STREQ(to_string(Dispatcher::flex), "flex");
  EXPECT_STREQ(to_string(RecomputeGranularity::selective), "selective");
  EXPECT_STREQ(to_string(AttentionKind::mla), "mla");
  EXPECT_STREQ(to_string(GpuKind::h200), "h200");
  EXPECT_STREQ(to_string(OffloadTier::host_pinned), "host_pinned");
  EXPECT_EQ(choice_value<Dispatcher>("train.token_dispatcher", "allgather"), Dispatcher::allgather);
  EXPECT_EQ(choice_value<Dispatcher>("train.token_dispatcher", "all_gather"), std::nullopt);
  EXPECT_THROW(choice_value<Dispatcher>("train.seq_length", "x"), std::logic_error);
}

}  // namespace
}  // namespace threewalls::scenarios
