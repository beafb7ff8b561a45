// Loader behaviour beyond the broken corpus: defaults from the registry, derived values, units,
// error ordering and batching, arrays of tables, paths relative to the scenario file.
#include <cmath>
#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "test_support.hpp"
#include "threewalls/core/input_file.hpp"
#include "threewalls/core/units.hpp"
#include "threewalls/scenarios/loader.hpp"

namespace threewalls::scenarios {
namespace {

// The [model] table of kMinimal: only required keys.
const std::string kMinimalModel = R"([model]
num_layers = 4
hidden_size = 512
num_attention_heads = 8
ffn_hidden_size = 2048
vocab_size = 32000
)";

// Smallest valid training scenario: only required keys.
const std::string kMinimal = "schema_version = 1\n\n" + kMinimalModel + R"(
[train]
micro_batch_size = 2
global_batch_size = 64
seq_length = 1024

[cluster]
gpu = "h100"
gpus_per_node = 8
nodes = 2
)";

std::string with(std::string text, const std::string& after, const std::string& insert) {
  const auto pos = text.find(after);
  if (pos == std::string::npos) throw std::runtime_error("test: '" + after + "' not in scenario text");
  text.insert(pos + after.size(), insert);
  return text;
}

Scenario load_ok(const std::string& text, const std::string& file = "dir/minimal.toml") {
  try {
    return load_scenario_text(text, file).scenario;
  } catch (const ScenarioError& e) {
    ADD_FAILURE() << e.what();
    throw;
  }
}

ScenarioError load_error(const std::string& text, const std::string& file = "dir/broken.toml") {
  try {
    (void)load_scenario_text(text, file);
  } catch (const ScenarioError& e) {
    return e;
  }
  ADD_FAILURE() << "loaded without error:\n" << text;
  return ScenarioError({});
}

TEST(ScenarioLoader, MinimalScenarioGetsRegistryDefaults) {
  const Scenario s = load_ok(kMinimal);
  // top level and [model]
  EXPECT_EQ(s.name, "minimal");  // derived: file name without .toml
  EXPECT_EQ(s.description, "");
  EXPECT_EQ(s.model.attention, AttentionKind::mha);
  EXPECT_EQ(s.model.attention_impl, AttentionImpl::fused);
  EXPECT_TRUE(s.model.swiglu);
  EXPECT_TRUE(s.model.untie_embeddings_and_output_weights);
  EXPECT_EQ(s.model.normalization, Normalization::rmsnorm);
  EXPECT_EQ(s.model.num_experts, 0);
  EXPECT_EQ(s.model.moe_layer_freq, 1);
  // [parallel] is absent altogether: its defaults still apply.
  EXPECT_EQ(s.parallel.tp, 1);
  EXPECT_EQ(s.parallel.cp, 1);
  EXPECT_EQ(s.parallel.pp, 1);
  EXPECT_EQ(s.parallel.vpp, 1);
  EXPECT_EQ(s.parallel.ep, 1);
  EXPECT_EQ(s.parallel.etp, 1);
  EXPECT_FALSE(s.parallel.sequence_parallel);
  EXPECT_TRUE(s.parallel.layers_per_stage.empty());
  // [train]
  ASSERT_TRUE(s.train.has_value());
  EXPECT_FALSE(s.infer.has_value());
  const auto& t = *s.train;
  EXPECT_EQ(t.exec.precision, Precision::bf16);
  EXPECT_TRUE(t.exec.cuda_graph_scope.empty());
  EXPECT_EQ(t.exec.token_dispatcher, Dispatcher::alltoall);
  EXPECT_EQ(t.exec.expert_execution.kind, ExpertExecutionKind::grouped);
  EXPECT_FALSE(t.exec.sync_routing_stats);
  EXPECT_EQ(t.recompute_granularity, RecomputeGranularity::none);
  EXPECT_EQ(t.recompute_method, RecomputeMethod::uniform);
  EXPECT_EQ(t.recompute_num_layers, 1);
  EXPECT_EQ(t.recompute_modules, std::vector<std::string>{"core_attn"});
  EXPECT_TRUE(t.use_distributed_optimizer);
  EXPECT_FALSE(t.overlap_grad_reduce);
  EXPECT_DOUBLE_EQ(t.routing_imbalance, 1.0);
  EXPECT_DOUBLE_EQ(t.grad_bucket_size_params, 40e6);
  // [cluster]: unit defaults converted to SI
  EXPECT_DOUBLE_EQ(s.cluster.nvlink_bandwidth.value, 450e9);
  EXPECT_DOUBLE_EQ(s.cluster.pcie_bandwidth.value, 64e9);
  EXPECT_DOUBLE_EQ(s.cluster.nic_bandwidth.value, 400e9 / 8);  // "400Gbps" is bits per second
  EXPECT_DOUBLE_EQ(s.cluster.nvlink_latency.value, 1e-6);
  EXPECT_DOUBLE_EQ(s.cluster.nic_latency.value, 2e-6);
  EXPECT_EQ(s.cluster.topology, Topology::rail_optimized);
  EXPECT_EQ(s.cluster.leaf_switch_ports, 64);
  EXPECT_DOUBLE_EQ(s.cluster.oversubscription, 1.0);
  EXPECT_TRUE(s.cluster.slowdowns.empty());
  // [calibration], [run], [run.profiler] are absent: defaults.
  EXPECT_EQ(s.calibration_profile, "auto");
  EXPECT_EQ(s.run.steps, 3);
  EXPECT_EQ(s.run.warmup_steps, 1);
  EXPECT_EQ(s.run.seed, 1234U);
  EXPECT_TRUE(s.run.profiler.enabled);
  EXPECT_EQ(s.run.profiler.start_step, 0);
  EXPECT_EQ(s.run.profiler.end_step, -1);
  EXPECT_EQ(s.run.profiler.record_every_n_steps, 10);
  EXPECT_EQ(s.run.profiler.flush_every_n_steps, 10);
  EXPECT_TRUE(s.run.profiler.ranks.empty());
  EXPECT_EQ(s.run.profiler.recorded, RecordedRanks::automatic);
  EXPECT_EQ(s.run.profiler.granularity, Granularity::layer);
}

TEST(ScenarioLoader, AnEmptyProfilerRankListIsAnErrorNotEveryRank) {
  const std::string text = std::string(kMinimal) + "\n[run.profiler]\nranks = []\n";
  const std::string msg = load_error(text).what();
  EXPECT_NE(msg.find("'ranks' = [] names no rank"), std::string::npos) << msg;
  EXPECT_NE(msg.find("run.profiler.enabled = false"), std::string::npos) << msg;
  EXPECT_NE(msg.find("broken.toml:"), std::string::npos) << msg;
}

TEST(ScenarioLoader, AttentionImplIsReadAndABadValueNamesTheAllowedOnes) {
  const Scenario s = load_ok(with(kMinimal, "vocab_size = 32000\n", "attention_impl = \"unfused\"\n"));
  EXPECT_EQ(s.model.attention_impl, AttentionImpl::unfused);
  EXPECT_STREQ(to_string(s.model.attention_impl), "unfused");
  const std::string msg = load_error(with(kMinimal, "vocab_size = 32000\n", "attention_impl = \"flash\"\n")).what();
  EXPECT_NE(msg.find("attention_impl"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"fused\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"unfused\""), std::string::npos) << msg;
}

TEST(ScenarioLoader, InferenceDefaultsAndOffloadOnlyWhenWritten) {
  const std::string moe = R"(schema_version = 1
[model]
num_layers = 2
hidden_size = 256
num_attention_heads = 4
vocab_size = 1000
num_experts = 8
moe_ffn_hidden_size = 128
moe_router_topk = 2
[infer]
batch_size = 4
prompt_length = 64
generate_tokens = 8
[cluster]
gpu = "h200"
gpus_per_node = 1
nodes = 1
)";
  const Scenario plain = load_ok(moe);
  ASSERT_TRUE(plain.infer.has_value());
  EXPECT_FALSE(plain.train.has_value());
  EXPECT_EQ(plain.infer->kv_cache_precision, Precision::bf16);
  EXPECT_DOUBLE_EQ(plain.infer->routing_skew, 0.0);
  EXPECT_FALSE(plain.infer->expert_offload.enabled);

  const Scenario off = load_ok(moe + "[infer.expert_offload]\ntier = \"host_pinned\"\ncache_experts_per_layer = 4\n");
  const auto& o = off.infer->expert_offload;
  EXPECT_TRUE(o.enabled);
  EXPECT_EQ(o.tier, OffloadTier::host_pinned);
  EXPECT_EQ(o.cache_experts_per_layer, 4);
  EXPECT_EQ(o.policy, CachePolicy::lru);
  EXPECT_EQ(o.prefetch, Prefetch::none);
  EXPECT_EQ(o.sync, ExpertSync::barrier);
  EXPECT_EQ(o.copy_streams, 1);
}

TEST(ScenarioLoader, DerivesDpEdpHeadDimQueryGroupsMicrobatchesAndGpuMemory) {
  const Scenario s = load_ok(kMinimal);
  EXPECT_EQ(s.parallel.dp, 16);   // world 16 / (tp 1 x cp 1 x pp 1)
  EXPECT_EQ(s.parallel.edp, 16);  // world 16 / (etp 1 x ep 1 x pp 1)
  EXPECT_EQ(s.model.kv_channels, 64);          // 512 / 8
  EXPECT_EQ(s.model.num_query_groups, 8);      // mha: = heads
  EXPECT_EQ(s.train->num_microbatches, 2);     // 64 / (2 x 16)
  EXPECT_DOUBLE_EQ(s.cluster.gpu_memory.value, gibibytes(79.6).value);  // h100 default

  std::string moe = with(kMinimal, "vocab_size = 32000\n",
                         "num_experts = 16\nmoe_ffn_hidden_size = 256\nmoe_router_topk = 2\nattention = \"gqa\"\n"
                         "num_query_groups = 2\n");
  moe = with(moe, "schema_version = 1\n", "\n[parallel]\ntp = 2\npp = 2\nep = 4\nsequence_parallel = true\n");
  const Scenario m = load_ok(with(moe, "nodes = 2\n", "gpu_memory = \"70GiB\"\n"));
  EXPECT_EQ(m.parallel.dp, 4);    // 16 / (2 x 1 x 2)
  EXPECT_EQ(m.parallel.edp, 2);   // 16 / (1 x 4 x 2)
  EXPECT_EQ(m.model.num_query_groups, 2);
  EXPECT_EQ(m.train->num_microbatches, 8);  // 64 / (2 x 4)
  EXPECT_DOUBLE_EQ(m.cluster.gpu_memory.value, gibibytes(70).value);  // written: not derived

  std::string h200 = kMinimal;
  h200.replace(h200.find("\"h100\""), 6, "\"h200\"");
  EXPECT_DOUBLE_EQ(load_ok(h200).cluster.gpu_memory.value, gibibytes(140.4).value);

  const std::string mla = with(kMinimal, "vocab_size = 32000\n",
                               "attention = \"mla\"\nkv_lora_rank = 512\nqk_head_dim = 128\n"
                               "qk_pos_emb_head_dim = 64\nv_head_dim = 96\n");
  const Scenario a = load_ok(mla);
  EXPECT_EQ(a.model.kv_channels, 96);  // mla: the value head dimension
  EXPECT_EQ(a.model.num_query_groups, 8);
}

TEST(ScenarioLoader, ExplicitDpIsKeptWhenConsistent) {
  const Scenario s = load_ok(with(kMinimal, "schema_version = 1\n", "[parallel]\ntp = 2\ndp = 8\n"));
  EXPECT_EQ(s.parallel.dp, 8);
  EXPECT_EQ(s.train->num_microbatches, 4);  // 64 / (2 x 8)
}

TEST(ScenarioLoader, ParsesUnitsThroughTheRegistryTypes) {
  const Scenario s = load_ok(with(kMinimal, "nodes = 2\n",
                                  "gpu_memory = \"24GiB\"\nnvlink_bandwidth = \"900GB/s\"\n"
                                  "pcie_bandwidth = \"32 GBps\"\nnic_bandwidth = \"200Gbps\"\n"
                                  "nvlink_latency = \"500ns\"\npcie_latency = \"1.5us\"\n"
                                  "nic_latency = \"2ms\"\nswitch_latency = \"0.25us\"\n"));
  EXPECT_DOUBLE_EQ(s.cluster.gpu_memory.value, 24.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(s.cluster.nvlink_bandwidth.value, 900e9);
  EXPECT_DOUBLE_EQ(s.cluster.pcie_bandwidth.value, 32e9);
  EXPECT_DOUBLE_EQ(s.cluster.nic_bandwidth.value, 25e9);
  EXPECT_DOUBLE_EQ(s.cluster.nvlink_latency.value, 500e-9);
  EXPECT_DOUBLE_EQ(s.cluster.pcie_latency.value, 1.5e-6);
  EXPECT_DOUBLE_EQ(s.cluster.nic_latency.value, 2e-3);
  EXPECT_DOUBLE_EQ(s.cluster.switch_latency.value, 0.25e-6);
  // SI "GB" and IEC "GiB" differ.
  const Scenario si = load_ok(with(kMinimal, "nodes = 2\n", "gpu_memory = \"80GB\"\n"));
  EXPECT_DOUBLE_EQ(si.cluster.gpu_memory.value, 80e9);
}

TEST(ScenarioLoader, ReportsErrorsSortedByLineNotByTableOrder) {
  // toml++ hands tables over in key order (cluster, model, train); the report must follow the file.
  const std::string text = R"(schema_version = 1
[train]
micro_batch_size = 0
global_batch_size = 8
seq_length = 1024
)" + kMinimalModel + R"(swiglu = "yes"
[cluster]
gpu = "h300"
gpus_per_node = 8
nodes = 1
)";
  const ScenarioError e = load_error(text);
  ASSERT_EQ(e.messages().size(), 3U) << e.what();
  EXPECT_EQ(e.messages()[0].rfind("dir/broken.toml:3:1: [train] 'micro_batch_size' = 0 is out of range", 0), 0U)
      << e.messages()[0];
  EXPECT_EQ(e.messages()[1].rfind("dir/broken.toml:12:1: [model] 'swiglu' must be true or false", 0), 0U)
      << e.messages()[1];
  EXPECT_EQ(e.messages()[2].rfind("dir/broken.toml:14:1: [cluster] 'gpu' = \"h300\" is not allowed", 0), 0U)
      << e.messages()[2];
  // what() lists the same messages, one per line, in the same order.
  EXPECT_EQ(std::string(e.what()), e.messages()[0] + "\n" + e.messages()[1] + "\n" + e.messages()[2]);
}

TEST(ScenarioLoader, ReportsSeveralRuleViolationsAtOnce) {
  std::string text = with(kMinimal, "schema_version = 1\n", "[parallel]\ndp = 3\nvpp = 2\n");
  text = with(text, "seq_length = 1024\n", "use_distributed_optimizer = false\noverlap_param_gather = true\n");
  const ScenarioError e = load_error(text);
  const std::string what = e.what();
  EXPECT_NE(what.find("[rule world-size]"), std::string::npos) << what;
  EXPECT_NE(what.find("[rule vpp-pp]"), std::string::npos) << what;
  EXPECT_NE(what.find("[rule overlap-param-gather]"), std::string::npos) << what;
  EXPECT_GE(e.messages().size(), 3U);
  for (std::size_t i = 1; i < e.messages().size(); ++i) {
    // sorted by line: compare the numeric line after "dir/broken.toml:"
    auto line = [](const std::string& m) { return std::stoi(m.substr(std::string("dir/broken.toml:").size())); };
    EXPECT_LE(line(e.messages()[i - 1]), line(e.messages()[i])) << what;
  }
}

TEST(ScenarioLoader, LoaderErrorsStopBeforeConsistencyRules) {
  // A key of the wrong type makes the values meaningless, so rules are not checked on them.
  const std::string text = with(with(kMinimal, "schema_version = 1\n", "[parallel]\ndp = 3\n"), "nodes = 2\n",
                                "topology = \"ring\"\n");
  const ScenarioError e = load_error(text);
  ASSERT_EQ(e.messages().size(), 1U) << e.what();
  EXPECT_NE(e.messages()[0].find("'topology' = \"ring\" is not allowed"), std::string::npos);
}

TEST(ScenarioLoader, UnknownKeyNamesLineColumnSuggestionAndAllowedKeys) {
  const ScenarioError e = load_error(with(kMinimal, "ffn_hidden_size = 2048\n", "  num_expert = 8\n"));
  ASSERT_EQ(e.messages().size(), 1U) << e.what();
  EXPECT_EQ(e.messages()[0].rfind("dir/broken.toml:8:3: [model] unknown key 'num_expert' (did you mean "
                                  "'num_experts'?); allowed here: name, num_layers, ",
                                  0),
            0U)
      << e.messages()[0];
}

TEST(ScenarioLoader, SlowdownArrayOfTablesFillsOneEntryEach) {
  const std::string text = std::string(kMinimal) + R"(
[[cluster.slowdown]]
rank = 3
factor = 1.5

[[cluster.slowdown]]
rank = 9
factor = 2
link = "nic"
from_step = 1
to_step = 2
)";
  const auto loaded = load_scenario_text(text, "dir/slow.toml");
  const auto& sd = loaded.scenario.cluster.slowdowns;
  ASSERT_EQ(sd.size(), 2U);
  EXPECT_EQ(sd[0].rank, 3);
  EXPECT_DOUBLE_EQ(sd[0].factor, 1.5);
  EXPECT_EQ(sd[0].link, SlowLink::none);  // defaults per element
  EXPECT_EQ(sd[0].from_step, 0);
  EXPECT_EQ(sd[0].to_step, -1);
  EXPECT_EQ(sd[1].rank, 9);
  EXPECT_DOUBLE_EQ(sd[1].factor, 2.0);
  EXPECT_EQ(sd[1].link, SlowLink::nic);
  EXPECT_EQ(sd[1].from_step, 1);
  EXPECT_EQ(sd[1].to_step, 2);
  // Locations carry the element index.
  ASSERT_TRUE(loaded.locations.count("cluster.slowdown[1].rank"));
  EXPECT_EQ(loaded.locations.at("cluster.slowdown[1].rank").line, 25);
  EXPECT_EQ(loaded.locations.at("cluster.slowdown[0].factor").line, 22);
}

TEST(ScenarioLoader, SlowdownInlineArrayAndErrorsPointAtTheElement) {
  const Scenario s = load_ok(with(kMinimal, "nodes = 2\n", "slowdown = [{ rank = 0, factor = 3.0 }]\n"));
  ASSERT_EQ(s.cluster.slowdowns.size(), 1U);
  EXPECT_DOUBLE_EQ(s.cluster.slowdowns[0].factor, 3.0);

  const std::string bad = std::string(kMinimal) + R"(
[[cluster.slowdown]]
rank = 0
factor = 2.0

[[cluster.slowdown]]
rank = 1
factor = 0.5
)";
  const ScenarioError e = load_error(bad);
  ASSERT_EQ(e.messages().size(), 1U) << e.what();
  EXPECT_EQ(e.messages()[0].rfind("dir/broken.toml:26:1: [cluster.slowdown] 'factor' = 0.5 is out of range", 0), 0U)
      << e.what();

  const std::string rank = std::string(kMinimal) + "\n[[cluster.slowdown]]\nrank = 0\nfactor = 2.0\n\n"
                                                   "[[cluster.slowdown]]\nrank = 16\nfactor = 2.0\n";
  const ScenarioError r = load_error(rank);
  EXPECT_NE(std::string(r.what()).find("dir/broken.toml:25:1: [cluster.slowdown[1]] slowdown rank 16 does not "
                                       "exist (world size 16) [rule slowdown-rank]"),
            std::string::npos)
      << r.what();
}

TEST(ScenarioLoader, RelativeCalibrationProfileResolvesAgainstTheScenarioFolder) {
  testing::TempDir dir;
  dir.write("profiles/h100.toml", "# a profile\n");
  dir.write("scenarios/s.toml", "");
  const std::string scenario_file = (dir.path() / "scenarios/s.toml").string();

  const std::string rel = std::string(kMinimal) + "[calibration]\nprofile = \"../profiles/h100.toml\"\n";
  const Scenario s = load_ok(rel, scenario_file);
  EXPECT_EQ(std::filesystem::weakly_canonical(s.calibration_profile),
            std::filesystem::weakly_canonical(dir.path() / "profiles/h100.toml"));

  // The same relative path is not looked up from the working directory or anywhere else.
  const std::string sibling = std::string(kMinimal) + "[calibration]\nprofile = \"profiles/h100.toml\"\n";
  const ScenarioError e = load_error(sibling, scenario_file);
  EXPECT_NE(std::string(e.what()).find("[rule calibration-profile]"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find((dir.path() / "scenarios/profiles/h100.toml").string()), std::string::npos)
      << e.what();

  // Absolute paths are taken as they are; "auto" is left for the simulator to resolve.
  const std::string abs_path = (dir.path() / "profiles/h100.toml").string();
  const Scenario a = load_ok(std::string(kMinimal) + "[calibration]\nprofile = \"" + abs_path + "\"\n", "x/y.toml");
  EXPECT_EQ(a.calibration_profile, abs_path);
  EXPECT_EQ(load_ok(std::string(kMinimal) + "[calibration]\nprofile = \"auto\"\n").calibration_profile, "auto");
}

TEST(ScenarioLoader, NameHashAndSourcePathProvenance) {
  const auto a = load_scenario_text(kMinimal, "some/where/alpha.toml").scenario;
  EXPECT_EQ(a.name, "alpha");
  EXPECT_EQ(a.source_path, "some/where/alpha.toml");
  EXPECT_EQ(a.content_hash.size(), 16U);
  const auto b = load_scenario_text(std::string(kMinimal) + "# a comment changes the bytes\n", "alpha.toml").scenario;
  EXPECT_NE(a.content_hash, b.content_hash);
  const auto named = load_ok(with(kMinimal, "schema_version = 1\n", "name = \"mine\"\n"));
  EXPECT_EQ(named.name, "mine");
}

TEST(ScenarioLoader, RecordsWhereEveryWrittenKeyAndTableIs) {
  const auto loaded = load_scenario_text(kMinimal, "m.toml");
  const auto& loc = loaded.locations;
  ASSERT_TRUE(loc.count("schema_version"));
  EXPECT_EQ(loc.at("schema_version").line, 1);
  ASSERT_TRUE(loc.count("model.hidden_size"));
  EXPECT_EQ(loc.at("model.hidden_size").line, 5);
  EXPECT_EQ(loc.at("model.hidden_size").column, 1);
  ASSERT_TRUE(loc.count("train.seq_length"));
  EXPECT_EQ(loc.at("train.seq_length").line, 13);
  EXPECT_FALSE(loc.count("parallel.tp"));  // not written: default, no location
}

TEST(ScenarioLoader, DottedKeysAndInlineTablesAreTheSameAsTables) {
  const std::string dotted = R"(schema_version = 1
model = { num_layers = 4, hidden_size = 512, num_attention_heads = 8, ffn_hidden_size = 2048, vocab_size = 32000 }
train.micro_batch_size = 2
train.global_batch_size = 64
train.seq_length = 1024
cluster.gpu = "h100"
cluster.gpus_per_node = 8
cluster.nodes = 2
)";
  const Scenario s = load_ok(dotted);
  EXPECT_EQ(s.model.hidden_size, 512);
  EXPECT_EQ(s.train->num_microbatches, 2);
  EXPECT_EQ(s.world_size(), 16);
}

TEST(ScenarioLoader, ChoicePatternStreamsN) {
  std::string moe = with(kMinimal, "vocab_size = 32000\n", "num_experts = 8\nmoe_ffn_hidden_size = 256\nmoe_router_topk = 2\n");
  const Scenario s = load_ok(with(moe, "seq_length = 1024\n", "expert_execution = \"streams:4\"\n"));
  EXPECT_EQ(s.train->exec.expert_execution.kind, ExpertExecutionKind::streams);
  EXPECT_EQ(s.train->exec.expert_execution.streams, 4);
  const ScenarioError e = load_error(with(moe, "seq_length = 1024\n", "expert_execution = \"streams:\"\n"));
  EXPECT_NE(std::string(e.what()).find("'expert_execution' = \"streams:\" is not allowed"), std::string::npos);
}

TEST(ScenarioLoader, ChoicePatternSplitNIsTransformerEnginesGroupedLinearForTraining) {
  std::string moe =
      with(kMinimal, "vocab_size = 32000\n", "num_experts = 8\nmoe_ffn_hidden_size = 256\nmoe_router_topk = 2\n");
  const Scenario s = load_ok(with(moe, "seq_length = 1024\n", "expert_execution = \"split:4\"\n"));
  EXPECT_EQ(s.train->exec.expert_execution.kind, ExpertExecutionKind::split);
  EXPECT_EQ(s.train->exec.expert_execution.streams, 4);
  EXPECT_EQ(to_string(s.train->exec.expert_execution), "split:4");
  // More streams than local experts: the experts use as many streams as there are experts (Transformer
  // Engine's round-robin), so Megatron's "split:4" holds for one local expert too.
  const Scenario nine = load_ok(with(moe, "seq_length = 1024\n", "expert_execution = \"split:9\"\n"));
  EXPECT_EQ(nine.train->exec.expert_execution.streams, 9);
  const ScenarioError e = load_error(with(moe, "seq_length = 1024\n", "expert_execution = \"split:1025\"\n"));
  EXPECT_NE(std::string(e.what()).find("expert_execution = \"split:1025\" needs 1 <= N <= 1024"), std::string::npos)
      << e.what();
}

TEST(ScenarioLoader, MissingFileIsAScenarioErrorNamingTheFile) {
  try {
    (void)load_scenario_file("/nonexistent/threewalls/x.toml");
    FAIL() << "no error";
  } catch (const ScenarioError& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent/threewalls/x.toml: cannot open scenario file (no such file)");
  }
}

TEST(ScenarioLoader, ScenarioErrorIsAnInputError) {
  // main() maps InputError to exit code 2; the loader's errors must be catchable as such.
  try {
    (void)load_scenario_text("", "empty.toml");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("empty.toml:1:1: the file is empty"), std::string::npos);
  }
}

// The loader reads only regular files of bounded size: a FIFO would block forever, /dev/zero never
// ends, a directory is not "an empty file", and a path the file system rejects is a clear error.
std::string file_error(const std::filesystem::path& path) {
  try {
    (void)load_scenario_file(path);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ScenarioLoader, RefusesADirectory) {
  const auto dir = std::filesystem::temp_directory_path();
  EXPECT_NE(file_error(dir).find(": cannot read scenario file (a directory; give a file)"), std::string::npos)
      << file_error(dir);
}

TEST(ScenarioLoader, RefusesAFifoWithoutBlocking) {
  const auto fifo = std::filesystem::temp_directory_path() / ("threewalls_fifo_" + std::to_string(::getpid()));
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string err = file_error(fifo);
  std::filesystem::remove(fifo);
  EXPECT_NE(err.find("not a regular file but a FIFO, socket or device"), std::string::npos) << err;
}

TEST(ScenarioLoader, RefusesAnEndlessDevice) {
  const std::string err = file_error("/dev/zero");
  EXPECT_NE(err.find("/dev/zero: cannot read scenario file (not a regular file"), std::string::npos) << err;
}

TEST(ScenarioLoader, RefusesAFileLargerThanTheInputLimit) {
  const auto big = std::filesystem::temp_directory_path() / ("threewalls_big_" + std::to_string(::getpid()) + ".toml");
  {
    std::ofstream out(big, std::ios::binary);
    out.seekp(static_cast<std::streamoff>(kMaxInputFileBytes));
    out.put('\n');  // sparse: takes no disk space
  }
  const std::string err = file_error(big);
  std::filesystem::remove(big);
  EXPECT_NE(err.find("bytes; input files are at most " + std::to_string(kMaxInputFileBytes) + " bytes"),
            std::string::npos)
      << err;
}

TEST(ScenarioLoader, AVeryLongNameIsAClearErrorWithTheNameShortened) {
  const std::string name(100000, 'x');
  const std::string err = file_error(name + ".toml");
  EXPECT_NE(err.find("cannot open scenario file ("), std::string::npos) << err.substr(0, 400);
  EXPECT_NE(err.find("(a path of 100005 characters)"), std::string::npos) << err.substr(0, 400);
  EXPECT_LT(err.size(), 500U);
}

}  // namespace
}  // namespace threewalls::scenarios
