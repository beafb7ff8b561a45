// Hugging Face config.json -> the [model] table (docs/import.md). Field names are those of the
// transformers configuration classes (MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig, DeepseekV2Config,
// DeepseekV3Config, DeepseekConfig, OlmoeConfig, GptOssConfig, LlamaConfig, MistralConfig, Qwen2Config).
#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "threewalls/core/error.hpp"
#include "threewalls/core/input_file.hpp"
#include "threewalls/core/jsonl.hpp"
#include "threewalls/scenarios/import.hpp"
#include "threewalls/scenarios/registry.hpp"

namespace threewalls::scenarios {
namespace {

using nlohmann::json;

enum class Family { mixtral, qwen2_moe, qwen3_moe, deepseek, deepseek_moe, olmoe, gpt_oss, dense };

struct Arch {
  const char* architecture;
  const char* model_type;
  Family family;
  bool qk_norm;  // RMSNorm of the queries and keys before the rotary embedding (q_norm, k_norm modules)
};

// Every family here applies rotary position embeddings (DeepSeek's MLA to its rotary dims only).
constexpr Arch kArchs[] = {
    {"MixtralForCausalLM", "mixtral", Family::mixtral, false},
    {"Qwen2MoeForCausalLM", "qwen2_moe", Family::qwen2_moe, false},
    {"Qwen3MoeForCausalLM", "qwen3_moe", Family::qwen3_moe, true},
    {"DeepseekV2ForCausalLM", "deepseek_v2", Family::deepseek, false},
    {"DeepseekV3ForCausalLM", "deepseek_v3", Family::deepseek, false},
    {"DeepseekForCausalLM", "deepseek", Family::deepseek_moe, false},
    {"OlmoeForCausalLM", "olmoe", Family::olmoe, true},
    {"GptOssForCausalLM", "gpt_oss", Family::gpt_oss, false},
    {"LlamaForCausalLM", "llama", Family::dense, false},
    {"MistralForCausalLM", "mistral", Family::dense, false},
    {"Qwen2ForCausalLM", "qwen2", Family::dense, false},
    {"Qwen3ForCausalLM", "qwen3", Family::dense, true},
};

// Architectures whose layers threewalls cannot express: refused with the feature named, never
// imported as something else.
constexpr std::pair<const char*, const char*> kRefused[] = {
    {"Qwen3NextForCausalLM",
     "linear-attention (Gated DeltaNet) layers between the full-attention ones "
     "(full_attention_interval, linear_* fields)"},
};

// Every field the importer knows: the ones it maps and the ones that describe nothing threewalls
// times (token ids, numerics, rotary scaling, dtypes). Others are reported as not understood.
const std::set<std::string>& known_fields() {
  static const std::set<std::string> k = {"_name_or_path",
                                          "transformers_version",
                                          "torch_dtype",
                                          "dtype",
                                          "bos_token_id",
                                          "eos_token_id",
                                          "pad_token_id",
                                          "initializer_range",
                                          "rms_norm_eps",
                                          "rope_theta",
                                          "rope_scaling",
                                          "max_position_embeddings",
                                          "use_cache",
                                          "attention_dropout",
                                          "attention_bias",
                                          "mlp_bias",
                                          "hidden_act",
                                          "output_router_logits",
                                          "router_aux_loss_coef",
                                          "aux_loss_alpha",
                                          "seq_aux",
                                          "norm_topk_prob",
                                          "scoring_func",
                                          "topk_method",
                                          "n_group",
                                          "topk_group",
                                          "routed_scaling_factor",
                                          "pretraining_tp",
                                          "auto_map",
                                          "quantization_config",
                                          "max_window_layers",
                                          "use_sliding_window",
                                          "sliding_window",
                                          "router_jitter_noise",
                                          "rope_type",
                                          "ep_size",
                                          "num_nextn_predict_layers",
                                          "architectures",
                                          "model_type",
                                          "head_dim",
                                          "layer_types",
                                          "swiglu_limit",
                                          "initial_context_length",
                                          "use_qk_norm",
                                          "qkv_bias",
                                          "use_mla",
                                          "tie_word_embeddings",
                                          "vocab_size",
                                          "num_hidden_layers",
                                          "hidden_size",
                                          "intermediate_size",
                                          "num_attention_heads",
                                          "num_key_value_heads",
                                          "num_local_experts",
                                          "num_experts",
                                          "num_experts_per_tok",
                                          "moe_intermediate_size",
                                          "shared_expert_intermediate_size",
                                          "decoder_sparse_step",
                                          "mlp_only_layers",
                                          "n_routed_experts",
                                          "n_shared_experts",
                                          "first_k_dense_replace",
                                          "moe_layer_freq",
                                          "q_lora_rank",
                                          "kv_lora_rank",
                                          "qk_rope_head_dim",
                                          "qk_nope_head_dim",
                                          "v_head_dim",
                                          "experts_per_token",
                                          "rope_interleave",
                                          "partial_rotary_factor",
                                          "clip_qkv"};
  return k;
}

class HfImporter {
 public:
  HfImporter(const json& j, std::string file) : j_(j), file_(std::move(file)) {}

  ScenarioDraft run() {
    if (!j_.is_object()) throw InputError(file_ + ": not a JSON object (a Hugging Face config.json)");
    refuse_unsupported_layers();
    const Arch& a = architecture();
    d_.name = "imported_hf";
    d_.header.push_back("Generated by `threewalls import hf` from " + file_ + " (" + a.architecture +
                        "); see docs/import.md.");
    d_.set("model", "name", a.architecture);
    d_.set("model", "num_layers", req("num_hidden_layers"));
    d_.set("model", "hidden_size", req("hidden_size"));
    d_.set("model", "num_attention_heads", req("num_attention_heads"));
    if (a.family == Family::deepseek) {
      map_mla();
    } else {
      map_gqa();
    }
    d_.set("model", "vocab_size", req("vocab_size"));
    d_.set("model", "swiglu", true);  // every supported family uses a gated SiLU MLP
    if (auto act = str("hidden_act"); act && *act != "silu") {
      d_.report.not_represented.push_back({"hidden_act", *act + ": modelled as a SwiGLU MLP of the same shape"});
    }
    const bool tie = opt_bool("tie_word_embeddings").value_or(false);
    d_.set("model", "untie_embeddings_and_output_weights", !tie);
    d_.set("model", "normalization", "rmsnorm");
    d_.set("model", "position_embedding_type", "rope");
    if (a.qk_norm || (a.family != Family::deepseek && opt_bool("use_qk_norm").value_or(false))) {
      d_.set("model", "qk_layernorm", true);
      if (a.family == Family::olmoe) {
        d_.report.not_represented.push_back(
            {"q_norm, k_norm",
             "OLMoE normalizes the whole query and key projections; timed as the per-head "
             "QK norm (qk_layernorm) over the same elements"});
      }
    }
    switch (a.family) {
      case Family::mixtral: map_mixtral(); break;
      case Family::qwen2_moe:
      case Family::qwen3_moe: map_qwen_moe(a.family == Family::qwen2_moe); break;
      case Family::deepseek:
      case Family::deepseek_moe: map_deepseek(); break;
      case Family::olmoe: set_experts(req("num_experts"), req("num_experts_per_tok"), req("intermediate_size")); break;
      case Family::gpt_oss: map_gpt_oss(); break;
      case Family::dense: d_.set("model", "ffn_hidden_size", req("intermediate_size")); break;
    }
    map_sliding_window();
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (!known_fields().count(it.key()) && it.key().rfind('_', 0) != 0) {  // "_name_or_path", "_comment": metadata
        d_.report.not_understood.push_back({it.key(), "unknown config field"});
      }
    }
    map_quantization();
    d_.report.ignored.push_back(
        {"rotary frequencies and scaling (rope_theta, rope_scaling), norm epsilon, token ids, "
         "dtype, router numerics",
         "no effect on what threewalls times; the rotary embedding itself is timed (position_embedding_type)"});
    return std::move(d_);
  }

 private:
  const Arch& architecture() {
    std::vector<std::string> names;
    if (auto it = j_.find("architectures"); it != j_.end() && it->is_array()) {
      for (const auto& n : *it) {
        if (n.is_string()) names.push_back(n.get<std::string>());
      }
    }
    const std::string type = str("model_type").value_or("");
    for (const auto& a : kArchs) {
      if (std::find(names.begin(), names.end(), a.architecture) != names.end()) return a;
    }
    if (names.empty()) {
      for (const auto& a : kArchs) {
        if (type == a.model_type) return a;
      }
    }
    std::string msg = file_ + ": architecture ";
    msg += names.empty() ? "model_type '" + type + "'" : "'" + names.front() + "'";
    msg += " is not supported (supported:";
    for (const auto& a : kArchs) msg += std::string(" ") + a.architecture;
    throw InputError(msg + ")");
  }

  // Layers other than (sliding-window) softmax attention: refused by name.
  void refuse_unsupported_layers() {
    std::vector<std::string> names;
    if (auto it = j_.find("architectures"); it != j_.end() && it->is_array()) {
      for (const auto& n : *it) {
        if (n.is_string()) names.push_back(n.get<std::string>());
      }
    }
    for (const auto& [arch, feature] : kRefused) {
      if (std::find(names.begin(), names.end(), arch) != names.end()) {
        throw InputError(file_ + ": " + arch + " is refused: " + feature +
                         " are not supported by threewalls, and importing them as attention layers would be "
                         "silently wrong");
      }
    }
    if (auto it = j_.find("layer_types"); it != j_.end() && it->is_array()) {
      for (const auto& t : *it) {
        if (!t.is_string()) throw InputError(file_ + ": layer_types must hold layer kinds (strings)");
        const std::string kind = t.get<std::string>();
        if (kind != "full_attention" && kind != "sliding_attention") {
          throw InputError(file_ + ": layer_types holds '" + kind +
                           "' layers, which threewalls does not support "
                           "(supported: full_attention, sliding_attention)");
        }
      }
    }
  }

  // quantization_config: the checkpoint's storage format, reported (the scenario's precision is the
  // computation's: bf16 or fp8 GEMMs, [exec] precision).
  void map_quantization() {
    auto it = j_.find("quantization_config");
    if (it == j_.end() || it->is_null()) return;
    std::string method = "unknown method";
    if (it->is_object() && it->contains("quant_method") && it->at("quant_method").is_string()) {
      method = it->at("quant_method").get<std::string>();
    }
    std::string detail;
    if (it->is_object() && it->contains("fmt") && it->at("fmt").is_string())
      detail += ", " + it->at("fmt").get<std::string>();
    if (it->is_object() && it->contains("weight_block_size"))
      detail += ", blocks " + it->at("weight_block_size").dump();
    d_.report.not_represented.push_back(
        {"quantization_config", method + detail +
                                    " weights: threewalls sizes and times weights in bf16 (or fp8 "
                                    "GEMMs with [exec] precision = \"fp8\"); the quantized checkpoint's memory and "
                                    "dequantization are not modelled"});
  }

  int req(const std::string& key) {
    auto v = opt_int(key);
    if (!v) throw InputError(file_ + ": missing integer field '" + key + "'");
    return *v;
  }
  std::optional<int> opt_int(const std::string& key) {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return std::nullopt;
    if (!it->is_number_integer() || it->get<long long>() < 0 || it->get<long long>() > 1000000000) {
      throw InputError(file_ + ": field '" + key + "' must be a non-negative integer, got " + it->dump());
    }
    return static_cast<int>(it->get<long long>());
  }
  std::optional<bool> opt_bool(const std::string& key) {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return std::nullopt;
    if (!it->is_boolean()) throw InputError(file_ + ": field '" + key + "' must be true or false, got " + it->dump());
    return it->get<bool>();
  }
  std::optional<std::string> str(const std::string& key) {
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  }

  void map_gqa() {
    const int heads = req("num_attention_heads");
    const int kv = opt_int("num_key_value_heads").value_or(heads);
    if (kv != heads) {
      d_.set("model", "attention", "gqa");
      d_.set("model", "num_query_groups", kv);
    }
    if (auto hd = opt_int("head_dim")) d_.set("model", "kv_channels", *hd);
  }

  void map_mla() {
    d_.set("model", "attention", "mla");
    d_.set("model", "q_lora_rank", opt_int("q_lora_rank").value_or(0));
    d_.set("model", "kv_lora_rank", req("kv_lora_rank"));
    d_.set("model", "qk_head_dim", req("qk_nope_head_dim"));
    d_.set("model", "qk_pos_emb_head_dim", req("qk_rope_head_dim"));
    d_.set("model", "v_head_dim", req("v_head_dim"));
  }

  void set_experts(int experts, int topk, int moe_ffn) {
    d_.set("model", "num_experts", experts);
    d_.set("model", "moe_ffn_hidden_size", moe_ffn);
    d_.set("model", "moe_router_topk", topk);
  }

  void map_mixtral() {
    set_experts(req("num_local_experts"), req("num_experts_per_tok"), req("intermediate_size"));
  }

  // Qwen2-MoE / Qwen3-MoE: every decoder_sparse_step-th layer (1-based: layer l is MoE when
  // (l + 1) % step == 0) is MoE unless listed in mlp_only_layers.
  void map_qwen_moe(bool shared) {
    set_experts(req("num_experts"), req("num_experts_per_tok"), req("moe_intermediate_size"));
    if (shared) {
      if (auto s = opt_int("shared_expert_intermediate_size"); s && *s > 0) {
        d_.set("model", "moe_shared_expert_intermediate_size", *s);
      }
    }
    const int layers = req("num_hidden_layers");
    const double max_layers = Registry::instance().find_param("model.num_layers")->max.value_or(1e9);
    if (layers > max_layers) {
      throw InputError(file_ + ": num_hidden_layers = " + std::to_string(layers) + " exceeds the scenario limit of " +
                       std::to_string(static_cast<long long>(max_layers)) + " layers (model.num_layers)");
    }
    const int step = std::max(1, opt_int("decoder_sparse_step").value_or(1));
    std::set<int> dense_only;
    if (auto it = j_.find("mlp_only_layers"); it != j_.end() && it->is_array()) {
      for (const auto& v : *it) {
        if (!v.is_number_integer()) throw InputError(file_ + ": mlp_only_layers must hold layer indices");
        dense_only.insert(v.get<int>());
      }
    }
    std::vector<int> pattern;
    for (int l = 0; l < layers; ++l) pattern.push_back(!dense_only.count(l) && (l + 1) % step == 0 ? 1 : 0);
    int first = 0;
    while (first < layers && pattern[static_cast<std::size_t>(first)] == 0) ++first;
    int freq = 1;
    if (step > 1) freq = step;
    for (int l = first; l < layers; ++l) {
      if (pattern[static_cast<std::size_t>(l)] != ((l - first) % freq == 0 ? 1 : 0)) {
        throw InputError(file_ + ": decoder_sparse_step = " + std::to_string(step) + " with mlp_only_layers gives a "
                         "pattern of MoE layers that model.first_dense_layers + model.moe_layer_freq cannot express "
                         "(layer " + std::to_string(l) + ")");
      }
    }
    if (first > 0) d_.set("model", "first_dense_layers", first);
    if (freq > 1) d_.set("model", "moe_layer_freq", freq);
    if (first > 0 || freq > 1) d_.set("model", "ffn_hidden_size", req("intermediate_size"));
  }

  void map_deepseek() {
    const int moe_ffn = req("moe_intermediate_size");
    set_experts(req("n_routed_experts"), req("num_experts_per_tok"), moe_ffn);
    if (auto s = opt_int("n_shared_experts"); s && *s > 0) {
      d_.set("model", "moe_shared_expert_intermediate_size", std::int64_t{*s} * moe_ffn);
    }
    const int first = opt_int("first_k_dense_replace").value_or(0);
    if (first > 0) {
      d_.set("model", "first_dense_layers", first);
      d_.set("model", "ffn_hidden_size", req("intermediate_size"));
    }
    if (auto f = opt_int("moe_layer_freq"); f && *f > 1) {
      d_.set("model", "moe_layer_freq", *f);
      d_.set("model", "ffn_hidden_size", req("intermediate_size"));
    }
    // Group-limited routing (DeepSeek-V3's n_group / topk_group): 1 group is no limit.
    const auto groups = opt_int("n_group");
    const auto group_topk = opt_int("topk_group");
    if (groups && *groups > 1) {
      if (!group_topk) throw InputError(file_ + ": n_group = " + std::to_string(*groups) + " without topk_group");
      d_.set("model", "moe_router_num_groups", *groups);
      d_.set("model", "moe_router_group_topk", *group_topk);
    }
    if (auto mtp = opt_int("num_nextn_predict_layers"); mtp && *mtp > 0) {
      d_.set("model", "mtp_num_layers", *mtp);  // run by training steps only, as inference runs the main model
    }
  }

  void map_gpt_oss() {
    auto topk = opt_int("num_experts_per_tok");
    if (!topk) topk = opt_int("experts_per_token");
    if (!topk) throw InputError(file_ + ": missing integer field 'num_experts_per_tok'");
    set_experts(req("num_local_experts"), *topk, req("intermediate_size"));
    d_.report.not_represented.push_back({"attention sinks", "GPT-OSS's per-head sink logits are not modelled"});
  }

  // Sliding-window attention: `sliding_window` keys per query (itself included, as transformers' masks
  // count them) on the layers that use it: those `layer_types` marks "sliding_attention"; without
  // layer_types every layer (Mistral), unless use_sliding_window is false; Qwen2's max_window_layers
  // keeps the first layers at full attention. Patterns model.window_attn_skip_freq cannot express are
  // reported and modelled as full attention.
  void map_sliding_window() {
    const auto sw = j_.find("sliding_window");
    if (sw == j_.end() || sw->is_null()) return;
    if (!sw->is_number_integer() || sw->get<long long>() < 1 || sw->get<long long>() > (1LL << 24)) {
      throw InputError(file_ + ": sliding_window must be a positive integer (keys per query), got " + sw->dump());
    }
    const int layers = static_cast<int>(req("num_hidden_layers"));
    std::vector<int> windowed(static_cast<std::size_t>(std::max(layers, 0)), 1);
    if (auto it = j_.find("layer_types"); it != j_.end() && it->is_array()) {
      if (static_cast<int>(it->size()) != layers) {
        throw InputError(file_ + ": layer_types has " + std::to_string(it->size()) + " entries for " +
                         std::to_string(layers) + " layers (num_hidden_layers)");
      }
      for (std::size_t l = 0; l < it->size(); ++l) windowed[l] = (*it)[l] == "sliding_attention" ? 1 : 0;
    } else if (!opt_bool("use_sliding_window").value_or(true)) {
      return;
    } else if (auto keep = opt_int("max_window_layers"); keep && j_.contains("use_sliding_window")) {
      for (int l = 0; l < std::min<int>(static_cast<int>(*keep), layers); ++l)
        windowed[static_cast<std::size_t>(l)] = 0;
    }
    const WindowLayers w = window_layers_of(windowed);
    if (!w.any) return;
    if (!w.skip_freq) {
      d_.report.not_represented.push_back(
          {"sliding_window",
           "sliding-window layers in a pattern other than 'every n-th layer full' "
           "(model.window_attn_skip_freq): modelled as full causal attention in every layer"});
      return;
    }
    d_.set("model", "window_size", static_cast<std::int64_t>(sw->get<long long>()));
    if (*w.skip_freq > 0) d_.set("model", "window_attn_skip_freq", static_cast<std::int64_t>(*w.skip_freq));
  }

  const json& j_;
  std::string file_;
  ScenarioDraft d_;
};

}  // namespace

ScenarioDraft import_hf_config(const std::string& json_text, const std::string& file) {
  json j;
  try {
    j = parse_json(json_text, file);  // refuses duplicate keys and numbers out of range
  } catch (const json::parse_error& e) {
    throw InputError(file + ": not valid JSON: " + e.what());
  }
  return HfImporter(j, file).run();
}

ScenarioDraft import_hf_file(const std::filesystem::path& path) {
  return import_hf_config(read_input_file(path, "Hugging Face config"), path.string());
}

}  // namespace threewalls::scenarios
