#pragma once
// Importing what users already have (docs/import.md): a Megatron-LM launch (shell script, argument
// list or YAML) or a Hugging Face config.json becomes a scenario draft, which is written as TOML with
// registry keys only and then loaded and validated like any hand-written scenario.
//
// Nothing is guessed silently: every input argument or field ends up in exactly one place —
// mapped to a key, "ignored" (known, but about something threewalls does not model: logging, data
// paths, learning-rate schedule, ...), "not represented" (it changes the step, but the scenario
// language has no key for it), or "not understood" (unknown, or its value could not be resolved).
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "threewalls/scenarios/registry.hpp"
#include "threewalls/scenarios/writer.hpp"

namespace threewalls::scenarios {

// One argument (or config field) with why it was not mapped to a key.
struct ImportNote {
  std::string name;    // "--lr", "num_nextn_predict_layers"
  std::string reason;  // "learning-rate schedule: no effect on step time"
};

struct ImportReport {
  std::vector<ImportNote> not_understood;   // unknown names and unresolvable values (--strict refuses)
  std::vector<ImportNote> not_represented;  // known and relevant, but no registry key holds it
  std::vector<ImportNote> ignored;          // known and irrelevant to step time, with the reason
  std::vector<std::string> notes;           // derivations: defaults taken from Megatron, conversions

  // The ignored names grouped by reason (reason, "--a, --b, ..."), in order of first appearance.
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> ignored_by_reason() const;
};

// A scenario under construction: registry keys and their values (scenarios/writer.hpp, ScenarioText),
// table by table in the order they were set, with what the import reported. Only registry keys may
// be set (set() throws std::logic_error otherwise: a bug here); the loader checks the values when the
// written text is loaded.
class ScenarioDraft {
 public:
  void set(const std::string& table, const std::string& key, Value value) { tables_.set(table, key, std::move(value)); }
  [[nodiscard]] std::optional<Value> get(const std::string& table, const std::string& key) const {
    return tables_.get(table, key);
  }
  void erase(const std::string& table, const std::string& key) { tables_.erase(table, key); }
  void add_element(const std::string& table) { tables_.add_element(table); }
  [[nodiscard]] bool has_table(const std::string& table) const { return tables_.has_table(table); }

  std::string name;
  std::string description;
  ImportReport report;
  std::vector<std::string> header;  // comment lines written at the top (sources, how it was made)

  // The scenario file: header comments, the report as comments, then the tables written through the
  // registry. With model_only only the [model] table (plus its comments) is written.
  [[nodiscard]] std::string to_toml(bool model_only = false) const;
  // The model-only text `model_toml` (to_toml(true)) completed into a scenario of one GPU and one
  // short micro-batch, for checking the model's values and rules with the loader.
  [[nodiscard]] static std::string model_check_scenario(const std::string& model_toml);

 private:
  ScenarioText tables_;
};

// ---- Megatron-LM ----

struct MegatronImportOptions {
  // Values of ${VAR} references (launch variables such as TP, GBS); they win over assignments found
  // in the script itself. Unresolved references make the argument "not understood".
  std::map<std::string, std::string> vars;
  std::optional<int> vocab_size;  // when the launch names a tokenizer file instead of a size
  std::string name;               // scenario name; default "imported_megatron"
  std::string source;             // where the arguments came from, for messages and the header
};

// Splits a launch into Megatron arguments ("--flag", values...), in order. Accepts a shell script
// (backslash continuations, comments, quotes, VAR=value assignments and ${VAR:-default} references,
// bash arrays), a plain argument list, or Megatron/Megatron-MoE YAML (`key: value`, `--key: value`,
// keys with underscores; `true` = flag given, `false`/`null` = flag absent). Unresolvable variables
// are kept as written (the importer reports them).
struct MegatronArg {
  std::string flag;                 // "--num-layers" (underscores turned into dashes)
  std::vector<std::string> values;  // after variable substitution
  int line = 0;                     // 1-based line in the source; 0 = command line
};
std::vector<MegatronArg> parse_megatron_launch(const std::string& text, bool yaml,
                                               const std::map<std::string, std::string>& vars);
// The command-line form: `threewalls import megatron -- --num-layers 32 ...`.
std::vector<MegatronArg> parse_megatron_argv(const std::vector<std::string>& argv,
                                             const std::map<std::string, std::string>& vars);

// Maps the arguments. Throws InputError for values that are present but wrong (a non-integer layer
// count, a moe-layer-freq pattern the scenario language cannot express, ...). The draft has
// [model], [parallel] and [train]; the caller adds the cluster.
ScenarioDraft import_megatron(const std::vector<MegatronArg>& args, const MegatronImportOptions& options);
// Reads a file (YAML when it ends in .yaml/.yml or looks like YAML) and imports it.
ScenarioDraft import_megatron_file(const std::filesystem::path& path, MegatronImportOptions options);

// Megatron's --moe-layer-freq: an integer N, or a Python list expression such as "([0]*3+[1]*58)"
// or "[1,0,1,0]"; returns one 0/1 entry per layer. Throws InputError when it cannot be evaluated.
std::vector<int> expand_moe_layer_freq(const std::string& expr, int num_layers);
// Megatron's --window-attn-skip-freq: an integer N (layers N, 2N, ... counted from 1 keep full attention)
// or a list expression as above with 1 for a sliding-window layer and 0 for a full one; returns one 0/1
// entry per layer (1 = windowed). Throws InputError when it cannot be evaluated.
std::vector<int> expand_window_attn_skip_freq(const std::string& expr, int num_layers);
// Which layers of a per-layer pattern (1 = sliding window) the scenario can express: none windowed
// (any = false); every layer windowed (skip_freq 0) or exactly every n-th layer, 1-based, at full
// attention (skip_freq n), as model.window_attn_skip_freq; any other pattern: skip_freq empty.
struct WindowLayers {
  bool any = false;
  std::optional<int> skip_freq;
};
WindowLayers window_layers_of(const std::vector<int>& windowed);
// Megatron's --pipeline-model-parallel-layout ("Et|(tt|)*30mL"): transformer layers ('t') per
// virtual stage, and the number of MTP layers ('m') seen. Throws InputError on a malformed layout.
struct PipelineLayout {
  std::vector<int> layers_per_stage;
  int mtp_layers = 0;
};
PipelineLayout parse_pipeline_layout(const std::string& layout);

// ---- Hugging Face config.json ----

// The [model] table of a Hugging Face config (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3,
// DeepSeekMoE, OLMoE, GPT-OSS, dense Llama/Mistral/Qwen2). Unknown architectures, and layers other
// than (sliding-window) softmax attention such as Qwen3-Next's linear attention, are refused by name
// (InputError).
ScenarioDraft import_hf_config(const std::string& json_text, const std::string& file);
ScenarioDraft import_hf_file(const std::filesystem::path& path);

// ---- completing a draft ----

// Sets the draft's [cluster] table from a shipped preset name (scenarios/clusters/<name>.toml, e.g.
// "h100-dgx") or from a TOML file's [cluster] table, with `nodes` set from `gpus` when given (gpus must
// be a multiple of gpus_per_node). Throws InputError naming the presets, or the file and line of an
// unknown key or a bad value.
void add_cluster_table(ScenarioDraft& d, const std::string& preset_or_path, std::optional<int> gpus);
std::vector<std::string> cluster_preset_names();

}  // namespace threewalls::scenarios
