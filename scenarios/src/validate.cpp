#include "validate.hpp"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <numeric>
#include <sstream>

#include "threewalls/core/strings.hpp"
#include "threewalls/scenarios/graph_scopes.hpp"
#include "threewalls/scenarios/rules.hpp"
#include "threewalls/scenarios/run_volume.hpp"
#include "threewalls/scenarios/stages.hpp"

namespace threewalls::scenarios {
namespace {

constexpr int kMaxExpertStreams = 1024;  // split:N: CUDA streams a rank's experts round-robin over

// The rules, in the order they are checked. Ids are stable: tests and users grep for them.
const std::vector<RuleInfo> kRules = {
    {"attention-kind",
     "mha needs num_query_groups = num_attention_heads; gqa needs num_query_groups; mla needs "
     "kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim and v_head_dim, which only mla may set; qk_layernorm "
     "applies to mha and gqa."},
    {"head-dim", "Without kv_channels, hidden_size must be divisible by num_attention_heads."},
    {"attention-window",
     "window_attn_skip_freq needs window_size > 0 (the layers it keeps at full attention are "
     "the exceptions to a sliding window)."},
    {"query-groups", "num_attention_heads must be divisible by num_query_groups."},
    {"dense-ffn", "A model with any dense layer needs ffn_hidden_size > 0."},
    {"moe-keys", "num_experts > 0 needs moe_ffn_hidden_size and moe_router_topk; a dense model must not set MoE keys."},
    {"moe-topk", "moe_router_topk must not exceed num_experts."},
    {"moe-router-groups",
     "moe_router_num_groups and moe_router_group_topk come together: num_experts divisible by "
     "the groups, group_topk at most the groups, and topk at most the experts of group_topk groups."},
    {"moe-layers", "first_dense_layers must leave at least one MoE layer in an MoE model."},
    {"world-size", "world = nodes x gpus_per_node must equal tp x cp x pp x dp."},
    {"expert-world", "world must be divisible by etp x ep x pp (edp = world / (etp x ep x pp))."},
    {"tp-heads", "num_attention_heads must be divisible by tp."},
    {"tp-query-groups", "num_query_groups must be divisible by tp."},
    {"tp-ffn",
     "ffn_hidden_size must be divisible by tp, moe_ffn_hidden_size by etp, and the shared expert size by tp."},
    {"ep-experts", "num_experts must be divisible by ep."},
    {"ep-dense", "ep > 1 or etp > 1 needs an MoE model."},
    {"pp-layers",
     "Layers must split across pp x vpp virtual stages: num_layers divisible by pp x vpp, or the "
     "explicit layers_per_stage (pp x vpp entries summing to num_layers), or first/last_stage_layers "
     "leaving a remainder divisible by the other stages."},
    {"vpp-pp", "vpp > 1 (interleaved schedule) needs pp > 1."},
    {"batch-divisible", "global_batch_size must be divisible by micro_batch_size x dp."},
    {"vpp-microbatches", "With vpp > 1 the number of micro-batches must be a multiple of pp (interleaved schedule)."},
    {"cp-seq", "With cp > 1, seq_length must be divisible by 2 x cp (load-balanced causal split)."},
    {"sp-tp", "sequence_parallel needs tp > 1."},
    {"sp-seq", "With sequence_parallel, seq_length / cp must be divisible by tp."},
    {"moe-tp-sp", "An MoE model with tp > 1 and ep > 1 needs sequence_parallel (Megatron-Core)."},
    {"fp8-dims", "fp8 needs hidden_size and every FFN size divisible by 16."},
    {"fp8-recipe",
     "fp8_recipe = \"mxfp8\" needs a Blackwell GPU (cluster.gpu = \"b200\" or \"gb200\"); its 1 x 32 blocks need "
     "hidden_size and every FFN size divisible by 32; \"blockwise\" (1 x 128 and 128 x 128 blocks) needs them "
     "divisible by 128 and fp8_format = \"e4m3\" (Transformer Engine's rules)."},
    {"overlap-param-gather", "overlap_param_gather needs use_distributed_optimizer."},
    {"ep-comm-overlap",
     "overlap_moe_expert_parallel_comm needs ep > 1, token_dispatcher alltoall or flex, no full recompute, and "
     "pp = 1 or vpp > 1 (Megatron-Core); delay_wgrad_compute needs overlap_moe_expert_parallel_comm."},
    {"fp8-param-gather",
     "fp8_param_gather needs precision = \"fp8\" and sharded optimizer state (use_distributed_optimizer or "
     "Megatron-FSDP), as Megatron-LM requires."},
    {"first-last-bf16",
     "first_last_layers_bf16 needs precision = \"fp8\" and an fp8_recipe other than \"delayed\" (Megatron-Core)."},
    {"fsdp",
     "data_parallel_sharding_strategy other than none (Megatron-FSDP) needs use_distributed_optimizer = true, as "
     "Megatron-FSDP sets it."},
    {"recompute",
     "selective recompute needs recompute_modules that exist in the model (moe*, shared_experts, "
     "mla_up_proj); full/block recompute_num_layers must not exceed the layers of a stage."},
    {"graph-scope",
     "CUDA-graph scopes moe_router and moe_preprocess need an MoE model; full_iteration excludes the "
     "other scopes; captured MoE scopes cannot contain the host read of sync_routing_stats."},
    {"expert-streams",
     "expert_execution = \"streams:N\" needs 1 <= N <= local experts (num_experts / ep); \"split:N\" needs "
     "1 <= N <= 1024 (fewer local experts use fewer streams) and is for training steps."},
    {"routing-imbalance", "routing_imbalance > 1 needs ep > 1 and must not exceed ep."},
    {"offload",
     "expert_offload needs an MoE model, cache_experts_per_layer <= num_experts / ep, nvme_path exactly "
     "when tier = \"nvme\"."},
    {"infer-layout", "Inference scenarios run without pipeline or context parallelism (pp = cp = 1)."},
    {"profiler-steps", "Profiler steps must lie in 0 .. steps-1 and end_step >= start_step; ranks must exist."},
    {"slowdown-rank", "A slowdown must name an existing rank."},
    {"calibration-profile", "calibration.profile must be \"auto\" or an existing file."},
    {"work-size",
     "A step must stay within what one process can expand, simulate and record: at most 2^31 - 1 "
     "tokens per micro-batch (or inference prefill), about 1 million ops per rank per step, 1 GiB of "
     "inference routing choices per step, 500 million simulated inference ops per run and a run "
     "directory of 8 GiB (recorded steps x recorded ranks x records per rank and step x 190 bytes, plus a header "
     "of about 4 KiB in each recorded rank's file; run.profiler.ranks = \"auto\" records one rank per rank class "
     "where every rank would pass 1 GiB)."},
};

class Reporter {
 public:
  Reporter(const KeyLocations& where, const std::string& file, ErrorList& errors)
      : where_(where), file_(file), errors_(errors) {}

  // Reports `message` at the location of `key` (or its table, or the file).
  void fail(const std::string& rule, const std::string& key, const std::string& message) {
    SourceLocation loc{file_, 1, 1};
    std::string probe = key;
    while (true) {
      auto it = where_.find(probe);
      if (it != where_.end()) {
        loc = it->second;
        break;
      }
      auto dot = probe.rfind('.');
      if (dot == std::string::npos) break;
      probe = probe.substr(0, dot);
    }
    auto dot = key.rfind('.');
    std::string table = dot == std::string::npos ? "top level" : key.substr(0, dot);
    errors_.add(loc, "[" + table + "] " + message + " [rule " + rule + "]");
    ++count_;
  }
  [[nodiscard]] bool given(const std::string& key) const { return where_.count(key) > 0; }
  [[nodiscard]] int count() const { return count_; }

 private:
  const KeyLocations& where_;
  const std::string& file_;
  ErrorList& errors_;
  int count_ = 0;
};

std::string num(long long v) { return std::to_string(v); }

// Products of parallel sizes: each is a 31-bit int, so three or four of them can overflow even 64 bits
// (found by tests/scenarios/fuzz/scenario_loader_fuzz); saturating_mul (run_volume.hpp) caps them.
std::string num_product(long long v) { return v >= kProductCap ? "more than 2^62" : num(v); }

void check_model(Scenario& s, Reporter& r) {
  auto& m = s.model;
  // attention-kind
  const bool mla_keys = r.given("model.kv_lora_rank") || r.given("model.qk_head_dim") ||
                        r.given("model.qk_pos_emb_head_dim") || r.given("model.v_head_dim") ||
                        r.given("model.q_lora_rank");
  switch (m.attention) {
    case AttentionKind::mha:
      if (r.given("model.num_query_groups") && m.num_query_groups != m.num_attention_heads) {
        r.fail("attention-kind", "model.num_query_groups",
               "num_query_groups = " + num(m.num_query_groups) + " differs from num_attention_heads = " +
                   num(m.num_attention_heads) + " but attention = \"mha\"; use attention = \"gqa\"");
      }
      break;
    case AttentionKind::gqa:
      if (!r.given("model.num_query_groups")) {
        r.fail("attention-kind", "model.attention", "attention = \"gqa\" needs model.num_query_groups");
      }
      break;
    case AttentionKind::mla:
      for (const char* k : {"kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"}) {
        if (!r.given(std::string("model.") + k)) {
          r.fail("attention-kind", "model.attention", std::string("attention = \"mla\" needs model.") + k);
        }
      }
      if (r.given("model.num_query_groups") || r.given("model.kv_channels")) {
        r.fail("attention-kind", r.given("model.num_query_groups") ? "model.num_query_groups" : "model.kv_channels",
               "num_query_groups and kv_channels do not apply to attention = \"mla\"");
      }
      break;
  }
  if (m.attention == AttentionKind::mla && m.qk_layernorm) {
    r.fail("attention-kind", "model.qk_layernorm",
           "qk_layernorm = true applies to attention = \"mha\" or \"gqa\"; MLA normalises its compressed latents "
           "(q_lora_rank, kv_lora_rank) instead");
  }
  if (m.attention != AttentionKind::mla && mla_keys) {
    r.fail("attention-kind", "model.attention",
           "kv_lora_rank, q_lora_rank, qk_head_dim, qk_pos_emb_head_dim and v_head_dim only apply to attention = "
           "\"mla\"");
  }
  if (m.window_attn_skip_freq > 0 && m.window_size == 0) {
    r.fail("attention-window", "model.window_attn_skip_freq",
           "window_attn_skip_freq = " + num(m.window_attn_skip_freq) +
               " needs model.window_size > 0 (the keys a windowed layer's query attends to)");
  }
  // head-dim (derived kv_channels)
  if (m.kv_channels == 0) {
    if (m.attention == AttentionKind::mla) {
      m.kv_channels = m.v_head_dim;
    } else if (m.hidden_size % m.num_attention_heads != 0) {
      r.fail("head-dim", "model.hidden_size",
             "hidden_size = " + num(m.hidden_size) + " is not divisible by num_attention_heads = " +
                 num(m.num_attention_heads) + "; set kv_channels (the head dimension) explicitly");
      m.kv_channels = 1;
    } else {
      m.kv_channels = m.hidden_size / m.num_attention_heads;
    }
  }
  if (m.num_query_groups == 0) m.num_query_groups = m.num_attention_heads;
  if (m.attention == AttentionKind::mla) m.num_query_groups = m.num_attention_heads;
  if (m.num_query_groups > m.num_attention_heads || m.num_attention_heads % m.num_query_groups != 0) {
    r.fail("query-groups", "model.num_query_groups",
           "num_attention_heads = " + num(m.num_attention_heads) + " is not divisible by num_query_groups = " +
               num(m.num_query_groups));
  }
  // MoE keys
  if (m.is_moe()) {
    if (m.moe_ffn_hidden_size == 0) r.fail("moe-keys", "model.num_experts", "num_experts > 0 needs model.moe_ffn_hidden_size");
    if (m.moe_router_topk == 0) r.fail("moe-keys", "model.num_experts", "num_experts > 0 needs model.moe_router_topk");
    if (m.moe_router_topk > m.num_experts) {
      r.fail("moe-topk", "model.moe_router_topk",
             "moe_router_topk = " + num(m.moe_router_topk) + " exceeds num_experts = " + num(m.num_experts));
    }
    if (m.moe_router_num_groups > 0 || m.moe_router_group_topk > 0) {
      const std::string key =
          m.moe_router_num_groups > 0 ? "model.moe_router_group_topk" : "model.moe_router_num_groups";
      if (m.moe_router_num_groups == 0 || m.moe_router_group_topk == 0) {
        r.fail("moe-router-groups", key, "moe_router_num_groups and moe_router_group_topk must be set together");
      } else if (m.num_experts % m.moe_router_num_groups != 0) {
        r.fail("moe-router-groups", "model.moe_router_num_groups",
               "num_experts = " + num(m.num_experts) +
                   " is not divisible by moe_router_num_groups = " + num(m.moe_router_num_groups));
      } else if (m.moe_router_group_topk > m.moe_router_num_groups) {
        r.fail("moe-router-groups", "model.moe_router_group_topk",
               "moe_router_group_topk = " + num(m.moe_router_group_topk) +
                   " exceeds moe_router_num_groups = " + num(m.moe_router_num_groups));
      } else if (m.moe_router_topk > m.num_experts / m.moe_router_num_groups * m.moe_router_group_topk) {
        r.fail("moe-router-groups", "model.moe_router_group_topk",
               "moe_router_topk = " + num(m.moe_router_topk) + " exceeds the " +
                   num(m.num_experts / m.moe_router_num_groups * m.moe_router_group_topk) + " experts of " +
                   num(m.moe_router_group_topk) + " groups");
      }
    }
    if (m.num_moe_layers() == 0) {
      r.fail("moe-layers", "model.first_dense_layers",
             "first_dense_layers = " + num(m.first_dense_layers) + " leaves no MoE layer of " + num(m.num_layers));
    }
  } else {
    for (const char* k : {"moe_ffn_hidden_size", "moe_router_topk", "moe_router_num_groups", "moe_router_group_topk",
                          "moe_shared_expert_intermediate_size", "first_dense_layers", "moe_layer_freq"}) {
      if (r.given(std::string("model.") + k)) {
        r.fail("moe-keys", std::string("model.") + k,
               std::string(k) + " only applies to MoE models (num_experts > 0)");
      }
    }
  }
  bool any_dense = false;
  for (int l = 0; l < m.num_layers; ++l) any_dense = any_dense || !m.layer_is_moe(l);
  if (any_dense && m.ffn_hidden_size == 0) {
    r.fail("dense-ffn", "model.ffn_hidden_size", "the model has dense layers but no ffn_hidden_size");
  }
}

// The fewest layers of any pipeline stage (needs a split that satisfies rule pp-layers).
int stage_layers_min(const Scenario& s) {
  const StageSplit split(s);
  auto fewest = std::numeric_limits<std::size_t>::max();
  for (int st = 0; st < s.parallel.pp; ++st) fewest = std::min(fewest, split.stage_layers(st).size());
  return static_cast<int>(fewest);
}

// Checks the parallel layout; returns whether the layer-to-stage split satisfies rule pp-layers.
bool check_parallel(Scenario& s, Reporter& r) {
  auto& p = s.parallel;
  const auto& m = s.model;
  const int world = s.world_size();
  const std::string world_text = "world size " + num(world) + " (nodes " + num(s.cluster.nodes) + " x gpus_per_node " +
                                 num(s.cluster.gpus_per_node) + ")";
  // world-size and derived dp
  const long long mp = saturating_mul(saturating_mul(p.tp, p.cp), p.pp);
  if (p.dp == 0) {
    if (world % mp != 0) {
      r.fail("world-size", "parallel.tp",
             "tp x cp x pp = " + num(p.tp) + " x " + num(p.cp) + " x " + num(p.pp) + " = " + num_product(mp) +
                 " does not divide the " + world_text);
      p.dp = 1;
    } else {
      p.dp = static_cast<int>(world / mp);
    }
  } else if (saturating_mul(mp, p.dp) != world) {
    r.fail("world-size", "parallel.dp",
           "tp x cp x pp x dp = " + num(p.tp) + " x " + num(p.cp) + " x " + num(p.pp) + " x " + num(p.dp) + " = " +
               num_product(saturating_mul(mp, p.dp)) + " does not equal the " + world_text);
  }
  // expert-world and derived edp
  const long long emp = saturating_mul(saturating_mul(p.etp, p.ep), p.pp);
  if (world % emp != 0) {
    r.fail("expert-world", "parallel.ep",
           "etp x ep x pp = " + num(p.etp) + " x " + num(p.ep) + " x " + num(p.pp) + " = " + num_product(emp) +
               " does not divide the " + world_text + ", so edp is not an integer");
    p.edp = 1;
  } else {
    p.edp = static_cast<int>(world / emp);
  }
  if (m.num_attention_heads % p.tp != 0) {
    r.fail("tp-heads", "parallel.tp",
           "num_attention_heads = " + num(m.num_attention_heads) + " is not divisible by tp = " + num(p.tp));
  }
  if (m.attention != AttentionKind::mla && m.num_query_groups % p.tp != 0) {
    r.fail("tp-query-groups", "parallel.tp",
           "num_query_groups = " + num(m.num_query_groups) + " is not divisible by tp = " + num(p.tp));
  }
  if (m.ffn_hidden_size % p.tp != 0) {
    r.fail("tp-ffn", "parallel.tp", "ffn_hidden_size = " + num(m.ffn_hidden_size) + " is not divisible by tp = " + num(p.tp));
  }
  if (m.is_moe() && m.moe_ffn_hidden_size % p.etp != 0) {
    r.fail("tp-ffn", "parallel.etp",
           "moe_ffn_hidden_size = " + num(m.moe_ffn_hidden_size) + " is not divisible by etp = " + num(p.etp));
  }
  if (m.moe_shared_expert_intermediate_size % p.tp != 0) {
    r.fail("tp-ffn", "parallel.tp",
           "moe_shared_expert_intermediate_size = " + num(m.moe_shared_expert_intermediate_size) +
               " is not divisible by tp = " + num(p.tp));
  }
  if (m.is_moe() && m.num_experts % p.ep != 0) {
    r.fail("ep-experts", "parallel.ep", "num_experts = " + num(m.num_experts) + " is not divisible by ep = " + num(p.ep));
  }
  if (!m.is_moe() && (p.ep > 1 || p.etp > 1)) {
    r.fail("ep-dense", p.ep > 1 ? "parallel.ep" : "parallel.etp",
           "ep = " + num(p.ep) + ", etp = " + num(p.etp) + " but the model has no experts (num_experts = 0)");
  }
  // pp-layers
  const int failures_before_split = r.count();
  const long long vstages = saturating_mul(p.pp, p.vpp);
  if (!p.layers_per_stage.empty()) {
    if (p.first_stage_layers || p.last_stage_layers) {
      r.fail("pp-layers", "parallel.layers_per_stage",
             "layers_per_stage and first_stage_layers/last_stage_layers cannot be used together");
    }
    long long sum = std::accumulate(p.layers_per_stage.begin(), p.layers_per_stage.end(), 0LL);
    if (static_cast<long long>(p.layers_per_stage.size()) != vstages) {
      r.fail("pp-layers", "parallel.layers_per_stage",
             "layers_per_stage has " + num(static_cast<long long>(p.layers_per_stage.size())) +
                 " entries but pp x vpp = " + num_product(vstages) + " virtual stages");
    } else if (sum != m.num_layers) {
      r.fail("pp-layers", "parallel.layers_per_stage",
             "layers_per_stage sums to " + num(sum) + " but num_layers = " + num(m.num_layers));
    }
  } else if (p.first_stage_layers || p.last_stage_layers) {
    if (p.vpp > 1) {
      r.fail("pp-layers", "parallel.first_stage_layers",
             "first_stage_layers/last_stage_layers need vpp = 1; use layers_per_stage with vpp > 1");
    } else {
      int rest_stages = p.pp - (p.first_stage_layers ? 1 : 0) - (p.last_stage_layers ? 1 : 0);
      const long long rest_layers = 1LL * m.num_layers - p.first_stage_layers - p.last_stage_layers;
      if (rest_stages < 0 || (rest_stages == 0 && rest_layers != 0) || rest_layers < 0 ||
          (rest_stages > 0 && (rest_layers % rest_stages != 0 || rest_layers == 0))) {
        r.fail("pp-layers", p.first_stage_layers ? "parallel.first_stage_layers" : "parallel.last_stage_layers",
               "num_layers = " + num(m.num_layers) + " minus first/last stage layers leaves " + num(rest_layers) +
                   " layers, not divisible over the remaining " + num(std::max(rest_stages, 0)) + " stages");
      }
    }
  } else if (m.num_layers % vstages != 0) {
    r.fail("pp-layers", "parallel.pp",
           "num_layers = " + num(m.num_layers) + " is not divisible by pp x vpp = " + num(p.pp) + " x " + num(p.vpp) +
               "; use layers_per_stage or first/last_stage_layers for an uneven split");
  }
  const bool split_ok = r.count() == failures_before_split;
  if (p.vpp > 1 && p.pp == 1) r.fail("vpp-pp", "parallel.vpp", "vpp = " + num(p.vpp) + " needs pp > 1");
  if (p.sequence_parallel && p.tp == 1) r.fail("sp-tp", "parallel.sequence_parallel", "sequence_parallel needs tp > 1");
  if (m.is_moe() && p.tp > 1 && p.ep > 1 && !p.sequence_parallel) {
    r.fail("moe-tp-sp", "parallel.sequence_parallel",
           "an MoE model with tp = " + num(p.tp) + " and ep = " + num(p.ep) + " needs sequence_parallel = true");
  }
  return split_ok;
}

void check_exec(const Scenario& s, const ExecOptions& e, const std::string& t, Reporter& r) {
  const auto& m = s.model;
  if (e.precision == Precision::fp8) {
    bool ok = m.hidden_size % 16 == 0 && m.ffn_hidden_size % 16 == 0 && m.moe_ffn_hidden_size % 16 == 0 &&
              m.moe_shared_expert_intermediate_size % 16 == 0;
    if (!ok) r.fail("fp8-dims", t + ".precision", "fp8 GEMMs need hidden and FFN sizes divisible by 16");
    const bool blackwell = s.cluster.gpu == GpuKind::b200 || s.cluster.gpu == GpuKind::gb200;
    if (e.fp8_recipe == Fp8Recipe::mxfp8 && !blackwell) {
      r.fail("fp8-recipe", t + ".fp8_recipe",
             std::string("fp8_recipe = \"mxfp8\" needs a Blackwell GPU (cluster.gpu = \"b200\" or \"gb200\"), not \"") +
                 threewalls::to_string(s.cluster.gpu) + "\"; Hopper recipes: delayed, tensorwise, blockwise");
    }
    const int block = e.fp8_recipe == Fp8Recipe::blockwise ? 128 : e.fp8_recipe == Fp8Recipe::mxfp8 ? 32 : 0;
    if (block > 0) {
      const bool dims = m.hidden_size % block == 0 && m.ffn_hidden_size % block == 0 &&
                        m.moe_ffn_hidden_size % block == 0 && m.moe_shared_expert_intermediate_size % block == 0;
      if (!dims) {
        r.fail("fp8-recipe", t + ".fp8_recipe",
               std::string("fp8_recipe = \"") + to_string(e.fp8_recipe) +
                   "\" needs hidden_size and every FFN size divisible by " + num(block));
      }
    }
    if (e.fp8_recipe == Fp8Recipe::blockwise && e.fp8_format != Fp8Format::e4m3) {
      r.fail("fp8-recipe", t + ".fp8_format", "fp8_recipe = \"blockwise\" needs fp8_format = \"e4m3\"");
    }
  }
  const auto& scopes = e.cuda_graph_scope;
  auto has = [&](const char* x) { return std::find(scopes.begin(), scopes.end(), x) != scopes.end(); };
  if ((has(graph_scopes::kMoeRouter) || has(graph_scopes::kMoePreprocess)) && !m.is_moe()) {
    r.fail("graph-scope", t + ".cuda_graph_scope", "cuda_graph_scope moe_router/moe_preprocess need an MoE model");
  }
  if (has(graph_scopes::kFullIteration) && scopes.size() > 1) {
    r.fail("graph-scope", t + ".cuda_graph_scope", "full_iteration captures everything; list it alone");
  }
  if (m.is_moe() && e.sync_routing_stats && (has(graph_scopes::kFullIteration) || has(graph_scopes::kMoePreprocess))) {
    r.fail("graph-scope", t + ".sync_routing_stats",
           "sync_routing_stats reads routing statistics on the host, which cannot happen inside a captured "
           "CUDA graph (cuda_graph_scope " + join(scopes, ", ", true) + ")");
  }
  if (e.expert_execution.kind == ExpertExecutionKind::streams ||
      e.expert_execution.kind == ExpertExecutionKind::split) {
    const std::string value = to_string(e.expert_execution);
    int local = m.is_moe() ? m.num_experts / std::max(1, s.parallel.ep) : 0;
    // split:N round-robins the experts over N streams, so fewer experts use fewer of them (as Transformer
    // Engine's GroupedLinear does); streams:N names N streams the loop itself creates.
    const bool split = e.expert_execution.kind == ExpertExecutionKind::split;
    const int most = split ? kMaxExpertStreams : std::max(local, 1);
    if (e.expert_execution.streams < 1 || e.expert_execution.streams > most || !m.is_moe()) {
      r.fail("expert-streams", t + ".expert_execution",
             "expert_execution = \"" + value + "\" needs " +
                 (split ? "1 <= N <= " + num(kMaxExpertStreams) + " and an MoE model"
                        : "1 <= N <= " + num(local) + " local experts"));
    }
    if (e.expert_execution.kind == ExpertExecutionKind::split && t == "infer") {
      r.fail("expert-streams", t + ".expert_execution",
             "expert_execution = \"" + value +
                 "\" (Transformer Engine's GroupedLinear) is modelled for training steps; inference steps run "
                 "\"grouped\", \"sequential\" or \"streams:N\"");
    }
  }
}

void check_train(Scenario& s, Reporter& r, bool split_ok) {
  auto& t = *s.train;
  const auto& p = s.parallel;
  const auto& m = s.model;
  check_exec(s, t.exec, "train", r);
  const long long per_step = 1LL * t.micro_batch_size * p.dp;
  if (t.global_batch_size % per_step != 0) {
    r.fail("batch-divisible", "train.global_batch_size",
           "global_batch_size = " + num(t.global_batch_size) + " is not divisible by micro_batch_size x dp = " +
               num(t.micro_batch_size) + " x " + num(p.dp) + " = " + num(per_step));
    t.num_microbatches = 1;
  } else {
    t.num_microbatches = static_cast<int>(t.global_batch_size / per_step);
  }
  if (p.vpp > 1 && t.num_microbatches % p.pp != 0) {
    r.fail("vpp-microbatches", "train.global_batch_size",
           num(t.num_microbatches) + " micro-batches per step is not a multiple of pp = " + num(p.pp) +
               ", which the interleaved schedule (vpp = " + num(p.vpp) + ") needs");
  }
  if (p.cp > 1 && t.seq_length % (2LL * p.cp) != 0) {
    r.fail("cp-seq", "train.seq_length",
           "seq_length = " + num(t.seq_length) + " is not divisible by 2 x cp = " + num(2LL * p.cp));
  }
  if (p.cp > 1 && m.window_size > 0) {
    r.fail("attention-window", "model.window_size",
           "window_size = " + num(m.window_size) + " with cp = " + num(p.cp) +
               ": the context-parallel ring of a sliding window is not modelled (use cp = 1)");
  }
  if (p.sequence_parallel && (t.seq_length / p.cp) % p.tp != 0) {
    r.fail("sp-seq", "train.seq_length",
           "seq_length / cp = " + num(t.seq_length / p.cp) + " is not divisible by tp = " + num(p.tp) +
               " (sequence_parallel splits the sequence over the TP group)");
  }
  // Megatron-Core's DDP gathers parameters with or without overlap_grad_reduce (Megatron-Bridge runs
  // that pair); only Megatron-LM's argument parser also asks for --overlap-grad-reduce.
  if (t.overlap_param_gather && !t.use_distributed_optimizer) {
    r.fail("overlap-param-gather", "train.overlap_param_gather",
           "overlap_param_gather needs use_distributed_optimizer = true (the overlapped all-gather is the "
           "distributed optimizer's)");
  }
  if (t.data_parallel_sharding_strategy != DataParallelSharding::none && !t.use_distributed_optimizer) {
    r.fail("fsdp", "train.data_parallel_sharding_strategy",
           std::string("data_parallel_sharding_strategy = \"") + to_string(t.data_parallel_sharding_strategy) +
               "\" (Megatron-FSDP) needs use_distributed_optimizer = true (Megatron-FSDP turns it on; allowed with "
               "use_distributed_optimizer = false: \"none\")");
  }
  if (t.fp8_param_gather) {
    if (t.exec.precision != Precision::fp8) {
      r.fail("fp8-param-gather", "train.fp8_param_gather", "fp8_param_gather needs train.precision = \"fp8\"");
    }
    if (!t.shards_optimizer_state()) {
      r.fail("fp8-param-gather", "train.fp8_param_gather",
             "fp8_param_gather needs sharded optimizer state: use_distributed_optimizer = true or a Megatron-FSDP "
             "data_parallel_sharding_strategy other than \"no_shard\" (the fp8 weights are re-quantized from the "
             "optimizer's master shards)");
    }
  }
  if (t.first_last_layers_bf16) {
    if (t.exec.precision != Precision::fp8) {
      r.fail("first-last-bf16", "train.first_last_layers_bf16",
             "first_last_layers_bf16 needs train.precision = \"fp8\" (it keeps the first and last layers of an fp8 "
             "model in bf16)");
    } else if (t.exec.fp8_recipe == Fp8Recipe::delayed) {
      r.fail("first-last-bf16", "train.first_last_layers_bf16",
             "first_last_layers_bf16 with fp8_recipe = \"delayed\": Megatron-Core refuses delayed scaling with bf16 "
             "layers (allowed: tensorwise, blockwise, mxfp8)");
    }
  }
  if (t.overlap_moe_expert_parallel_comm) {
    const std::string key = "train.overlap_moe_expert_parallel_comm";
    if (p.ep <= 1) r.fail("ep-comm-overlap", key, "overlap_moe_expert_parallel_comm needs ep > 1");
    if (t.exec.token_dispatcher == Dispatcher::allgather) {
      r.fail("ep-comm-overlap", key,
             "overlap_moe_expert_parallel_comm needs token_dispatcher = \"alltoall\" or \"flex\" (got \"allgather\")");
    }
    if (t.recompute_granularity == RecomputeGranularity::full) {
      r.fail("ep-comm-overlap", key, "overlap_moe_expert_parallel_comm cannot be combined with full recompute");
    }
    if (p.pp > 1 && p.vpp <= 1) {
      r.fail("ep-comm-overlap", key,
             "overlap_moe_expert_parallel_comm with pp = " + num(p.pp) +
                 " needs the interleaved schedule (vpp > 1), as Megatron-Core does");
    }
  }
  if (t.delay_wgrad_compute && !t.overlap_moe_expert_parallel_comm) {
    r.fail("ep-comm-overlap", "train.delay_wgrad_compute",
           "delay_wgrad_compute needs overlap_moe_expert_parallel_comm = true");
  }
  if (t.recompute_granularity == RecomputeGranularity::selective) {
    if (t.recompute_modules.empty()) {
      r.fail("recompute", "train.recompute_modules", "selective recompute needs at least one recompute module");
    }
    for (const auto& mod : t.recompute_modules) {
      if ((mod == "moe" || mod == "moe_act") && !m.is_moe()) {
        r.fail("recompute", "train.recompute_modules", "recompute module \"" + mod + "\" needs an MoE model");
      }
      if (mod == "shared_experts" && m.moe_shared_expert_intermediate_size == 0) {
        r.fail("recompute", "train.recompute_modules", "recompute module \"shared_experts\" needs shared experts");
      }
      if (mod == "mla_up_proj" && m.attention != AttentionKind::mla) {
        r.fail("recompute", "train.recompute_modules", "recompute module \"mla_up_proj\" needs attention = \"mla\"");
      }
    }
  } else if (r.given("train.recompute_modules")) {
    r.fail("recompute", "train.recompute_modules", "recompute_modules only apply to recompute_granularity = \"selective\"");
  }
  if (t.recompute_granularity == RecomputeGranularity::full && t.recompute_method == RecomputeMethod::block &&
      split_ok) {
    int per_stage = stage_layers_min(s);
    if (t.recompute_num_layers > per_stage) {
      r.fail("recompute", "train.recompute_num_layers",
             "recompute_num_layers = " + num(t.recompute_num_layers) + " exceeds the " + num(per_stage) +
                 " layers of a pipeline stage");
    }
  }
  if (t.routing_imbalance > 1.0) {
    if (p.ep <= 1 || !m.is_moe()) {
      r.fail("routing-imbalance", "train.routing_imbalance", "routing_imbalance > 1 needs an MoE model with ep > 1");
    } else if (t.routing_imbalance > p.ep) {
      r.fail("routing-imbalance", "train.routing_imbalance",
             "routing_imbalance cannot exceed ep = " + num(p.ep) + " (one rank receiving every token)");
    }
  }
}

void check_infer(Scenario& s, Reporter& r) {
  auto& inf = *s.infer;
  const auto& m = s.model;
  check_exec(s, inf.exec, "infer", r);
  if (s.parallel.pp > 1 || s.parallel.cp > 1) {
    r.fail("infer-layout", s.parallel.pp > 1 ? "parallel.pp" : "parallel.cp",
           "inference scenarios run with pp = 1 and cp = 1 in this version");
  }
  if (s.infer->expert_offload.enabled) {
    const auto& o = inf.expert_offload;
    if (!m.is_moe()) {
      r.fail("offload", "infer.expert_offload", "expert_offload needs an MoE model");
    } else {
      int local = m.num_experts / std::max(1, s.parallel.ep);
      if (o.cache_experts_per_layer > local) {
        r.fail("offload", "infer.expert_offload.cache_experts_per_layer",
               "cache_experts_per_layer = " + num(o.cache_experts_per_layer) + " exceeds the " + num(local) +
                   " experts of a layer on one rank");
      }
    }
    if (o.tier == OffloadTier::nvme && o.nvme_path.empty()) {
      r.fail("offload", "infer.expert_offload.tier", "tier = \"nvme\" needs nvme_path");
    }
    if (o.tier != OffloadTier::nvme && !o.nvme_path.empty()) {
      r.fail("offload", "infer.expert_offload.nvme_path", "nvme_path only applies to tier = \"nvme\"");
    }
  }
}

void check_run(Scenario& s, Reporter& r, const std::string& file) {
  const auto& pr = s.run.profiler;
  const int world = s.world_size();
  if (pr.start_step >= s.run.steps) {
    r.fail("profiler-steps", "run.profiler.start_step",
           "start_step = " + num(pr.start_step) + " is past the last step (steps = " + num(s.run.steps) + ")");
  }
  if (pr.end_step >= 0 && pr.end_step < pr.start_step) {
    r.fail("profiler-steps", "run.profiler.end_step",
           "end_step = " + num(pr.end_step) + " is before start_step = " + num(pr.start_step));
  }
  for (int rank : pr.ranks) {
    if (rank >= world) {
      r.fail("profiler-steps", "run.profiler.ranks",
             "rank " + num(rank) + " does not exist (world size " + num(world) + ")");
      break;
    }
  }
  for (std::size_t i = 0; i < s.cluster.slowdowns.size(); ++i) {
    const auto& sd = s.cluster.slowdowns[i];
    if (sd.rank >= world) {
      r.fail("slowdown-rank", "cluster.slowdown[" + std::to_string(i) + "].rank",
             "slowdown rank " + num(sd.rank) + " does not exist (world size " + num(world) + ")");
    }
    if (sd.to_step >= 0 && sd.to_step < sd.from_step) {
      r.fail("slowdown-rank", "cluster.slowdown[" + std::to_string(i) + "].to_step", "to_step is before from_step");
    }
  }
  if (s.calibration_profile != "auto") {
    std::filesystem::path p(s.calibration_profile);
    if (p.is_relative()) p = std::filesystem::path(file).parent_path() / p;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(p, ec)) {
      r.fail("calibration-profile", "calibration.profile",
             "calibration profile '" + s.calibration_profile + "' not found (looked at " + p.string() +
                 "); use \"auto\" for the shipped profile of the GPU kind");
    } else {
      s.calibration_profile = p.string();
    }
  }
}

// ---- work-size: how big a step and a run would get, estimated from the keys before anything is expanded ----
constexpr long long kMaxTokensPerMicrobatch = 2147483647LL;  // Op::tokens is 32-bit
constexpr long long kMaxOpsPerRankStep = 1000000LL;          // ~1 GiB and about a minute of simulation per step
constexpr long long kMaxRoutingChoiceBytes = 1LL << 30;      // sampled expert ids of one step
constexpr long long kMaxInferenceOpsPerRun = 500000000LL;    // inference re-expands every step
// The run directory of one run (its phases files): the largest shipped or validation scenario writes
// well under 1 GiB, and run.profiler.ranks = "auto" (the default) keeps a wide world at one file per
// rank class. 8 GiB is what a user may still ask for explicitly: about 30 s of writing on a 2-core VM
// (docs/performance.md), and more than analyze or compare read in reasonable time. Every rank of a
// 1,024-GPU DeepSeek-V3 step (about 26 GiB) is refused; its representatives take 0.2 GiB.
constexpr long long kMaxRunDirBytes = 8LL << 30;
constexpr long long kOpsPerLayer = 48;        // fwd + bwd ops of one layer and micro-batch
constexpr long long kOpsPerLocalExpert = 10;  // when experts run one by one

std::string gib(long long bytes) {
  std::ostringstream os;
  os.precision(3);
  os << static_cast<double>(bytes) / static_cast<double>(1LL << 30) << " GiB";
  return os.str();
}

void check_work_size(const Scenario& s, Reporter& r) {
  const auto& m = s.model;
  const auto& p = s.parallel;
  const long long local_experts = m.is_moe() ? m.num_experts / std::max(1, p.ep) : 0;
  const ExecOptions& exec = s.train ? s.train->exec : s.infer->exec;
  const bool per_expert_ops =
      exec.expert_execution.kind != ExpertExecutionKind::grouped || (s.infer && s.infer->expert_offload.enabled);
  const long long layer_ops = kOpsPerLayer + (per_expert_ops ? kOpsPerLocalExpert * local_experts : 0);
  const long long stage_layers = (m.num_layers + p.pp - 1) / p.pp;
  long long ops_per_step = 0;  // of the busiest rank
  std::string ops_keys;
  if (s.train) {
    const auto& t = *s.train;
    const long long tokens = 1LL * t.micro_batch_size * t.seq_length;
    if (tokens > kMaxTokensPerMicrobatch) {
      r.fail("work-size", "train.seq_length",
             "micro_batch_size x seq_length = " + num(t.micro_batch_size) + " x " + num(t.seq_length) + " = " +
                 num(tokens) + " tokens per micro-batch; at most " + num(kMaxTokensPerMicrobatch) +
                 ": lower train.micro_batch_size or train.seq_length");
    }
    ops_per_step = saturating_mul(saturating_mul(stage_layers, std::max(1, t.num_microbatches)), layer_ops);
    ops_keys = "lower train.global_batch_size (" + num(t.num_microbatches) +
               " micro-batches per step), model.num_layers or raise parallel.pp";
  } else {
    const auto& inf = *s.infer;
    const long long tokens = 1LL * inf.batch_size * inf.prompt_length;
    if (tokens > kMaxTokensPerMicrobatch) {
      r.fail("work-size", "infer.prompt_length",
             "batch_size x prompt_length = " + num(inf.batch_size) + " x " + num(inf.prompt_length) + " = " +
                 num(tokens) + " prefill tokens; at most " + num(kMaxTokensPerMicrobatch) +
                 ": lower infer.batch_size or infer.prompt_length");
    }
    const long long choice_bytes =
        saturating_mul(saturating_mul(saturating_mul(tokens, std::max(1, m.moe_router_topk)), m.num_moe_layers()), 4);
    if (m.is_moe() && choice_bytes > kMaxRoutingChoiceBytes) {
      r.fail("work-size", "infer.batch_size",
             "the prefill step routes " + num(tokens) + " tokens x top-" + num(m.moe_router_topk) + " x " +
                 num(m.num_moe_layers()) + " MoE layers = " + gib(choice_bytes) + " of expert choices; at most " +
                 gib(kMaxRoutingChoiceBytes) + ": lower infer.batch_size or infer.prompt_length");
    }
    ops_per_step = saturating_mul(m.num_layers, layer_ops);
    ops_keys = "lower model.num_layers or the experts per rank (model.num_experts / parallel.ep)";
    const long long run_ops = saturating_mul(ops_per_step, 1LL * s.run.steps + s.run.warmup_steps);
    if (ops_per_step <= kMaxOpsPerRankStep && run_ops > kMaxInferenceOpsPerRun) {
      r.fail("work-size", "run.steps",
             "the run would simulate about " + num_product(run_ops) + " ops (" + num(s.run.warmup_steps + s.run.steps) +
                 " steps of about " + num(ops_per_step) + "); at most " + num(kMaxInferenceOpsPerRun) +
                 ": lower run.steps");
    }
  }
  if (ops_per_step > kMaxOpsPerRankStep) {
    r.fail("work-size", s.train ? "train.global_batch_size" : "model.num_layers",
           "a step would expand to about " + num_product(ops_per_step) + " ops per rank; at most " +
               num(kMaxOpsPerRankStep) + ": " + ops_keys);
    return;
  }
  // Records: recorded steps x recording ranks x records per rank and step (run_volume.hpp).
  const auto& pr = s.run.profiler;
  if (!pr.enabled) return;
  const long long steps = recorded_steps(s);
  // "representatives" records one rank per rank class. A training step without slow ranks has one
  // class per pipeline stage, two with imbalanced MoE routing (the hot EP rank; expand_training); slow
  // ranks split off more classes, and inference classes are not known before expansion: pp x 8 then.
  const bool hot_rank = s.train && m.is_moe() && p.ep > 1 && s.train->routing_imbalance > 1.0;
  const long long classes =
      s.train && s.cluster.slowdowns.empty() ? saturating_mul(p.pp, hot_rank ? 2 : 1) : saturating_mul(p.pp, 8);
  const long long representatives = std::min<long long>(s.world_size(), classes);
  long long ranks = s.world_size();
  switch (pr.recorded) {
    case RecordedRanks::automatic:
      if (!auto_records_every_rank(s, ops_per_step)) ranks = representatives;
      break;
    case RecordedRanks::all: break;
    case RecordedRanks::representatives: ranks = representatives; break;
    case RecordedRanks::listed: ranks = static_cast<long long>(pr.ranks.size()); break;
  }
  const long long per_step = records_per_rank_step(s, ops_per_step);
  const long long bytes = run_dir_bytes(steps, ranks, per_step);
  if (bytes > kMaxRunDirBytes) {
    r.fail("work-size", "run.profiler.ranks",
           "the run directory would take about " + gib(bytes) + " (" + num(steps) + " recorded steps x " + num(ranks) +
               " recorded ranks x about " + num(per_step) + " records per rank and step x " + num(kBytesPerRecord) +
               " bytes per record, plus a header of about " + num(kHeaderBytesPerFile) +
               " bytes per recorded rank); at most " + gib(kMaxRunDirBytes) +
               ": record fewer ranks (run.profiler.ranks = \"representatives\" or a list of ranks), fewer steps "
               "(run.steps, run.profiler.record_every_n_steps or end_step) or granularity = \"coarse\"");
  }
}

}  // namespace

const std::vector<RuleInfo>& consistency_rules() { return kRules; }

std::string rules_markdown() {
  std::ostringstream os;
  os << "# Scenario consistency rules\n\n"
     << "<!-- Generated by `threewalls describe --rules-markdown` from scenarios/src/validate.cpp; do not edit. -->\n\n"
     << "Checked after every key has been read; each failure names the file, line and column of the key, the "
        "values involved and the rule id. Most follow Megatron-Core's argument checks.\n\n"
     << "| rule | what must hold |\n|---|---|\n";
  for (const auto& r : kRules) os << "| `" << r.id << "` | " << r.text << " |\n";
  return os.str();
}

void validate_and_derive(Scenario& s, const KeyLocations& where, const std::string& file, ErrorList& errors) {
  Reporter r(where, file, errors);
  // gpu_memory default by kind: usable memory as CUDA reports it (81559 MiB on H100 80GB HBM3,
  // 143771 MiB on H200), rounded down to 0.1 GiB.
  if (!r.given("cluster.gpu_memory")) {
    s.cluster.gpu_memory = gpu_spec(s.cluster.gpu).usable_memory;
  }
  if (!r.given("cluster.nvlink_bandwidth")) s.cluster.nvlink_bandwidth = gpu_spec(s.cluster.gpu).nvlink_bandwidth;
  check_model(s, r);
  const bool split_ok = check_parallel(s, r);
  if (s.train) check_train(s, r, split_ok);
  if (s.infer) check_infer(s, r);
  check_run(s, r, file);
  // Sizes are estimated only for a consistent layout (derived dp, micro-batches and stage split).
  if (r.count() == 0) check_work_size(s, r);
}

void recheck_scenario(Scenario& s, const KeyLocations& locations) {
  ErrorList errors;
  const std::string file = s.source_path.empty() ? std::string("<scenario>") : s.source_path;
  validate_and_derive(s, locations, file, errors);
  errors.throw_if_any();
}

}  // namespace threewalls::scenarios
