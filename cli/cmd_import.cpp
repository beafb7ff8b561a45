// threewalls import megatron|hf: a scenario from what users already have (docs/import.md).
#include <filesystem>
#include <fstream>
#include <iostream>

#include "args.hpp"
#include "command.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/import.hpp"
#include "threewalls/scenarios/loader.hpp"

namespace threewalls::cli {
namespace {

struct Common {
  std::string cluster;
  int gpus = 0;
  std::string out;
  bool overwrite = false;
  bool strict = false;
  bool model_only = false;
  std::string name;
};

void add_common(CLI::App* sub, Common& c) {
  sub->add_option("--cluster", c.cluster,
                  "Cluster preset (h100-dgx, h200-dgx: scenarios/clusters/) or a TOML file whose [cluster] table is used");
  sub->add_option("--gpus", c.gpus, "Total GPUs: sets cluster.nodes = GPUS / gpus_per_node (must divide); dp is derived")
      ->check(CLI::Range(1, 10000000));
  sub->add_option("--out", c.out, "Write the scenario here instead of stdout");
  add_overwrite_flag(sub, c.overwrite, "Replace an existing --out file");
  sub->add_flag("--strict", c.strict, "Refuse the import when any argument or field is not understood");
  sub->add_flag("--model-only", c.model_only, "Write only the [model] table (no cluster, layout or batch needed)");
  sub->add_option("--name", c.name, "Scenario (and model) name");
}

void print_report(const scenarios::ImportReport& r) {
  for (const auto& n : r.not_understood) std::cerr << "not understood: " << n.name << ": " << n.reason << "\n";
  for (const auto& n : r.not_represented) std::cerr << "not represented: " << n.name << ": " << n.reason << "\n";
  for (const auto& [reason, names] : r.ignored_by_reason()) std::cerr << "ignored: " << names << " (" << reason << ")\n";
  for (const auto& n : r.notes) std::cerr << "note: " << n << "\n";
}

// Completes the draft, checks it through the normal loader and writes it. Exit 2 when the result
// does not validate (the validator's errors are printed; the text is still written so it can be fixed).
int finish(scenarios::ScenarioDraft& d, const Common& c) {
  print_report(d.report);
  if (c.strict && !d.report.not_understood.empty()) {
    throw InputError("--strict: " + std::to_string(d.report.not_understood.size()) +
                     " argument(s) or field(s) not understood (listed above)");
  }
  if (!c.name.empty()) d.name = c.name;
  if (!c.model_only) {
    if (c.cluster.empty()) {
      throw InputError("--cluster is needed for a full scenario (presets: h100-dgx, h200-dgx, or a TOML file); "
                       "or pass --model-only");
    }
    scenarios::add_cluster_table(d, c.cluster, c.gpus > 0 ? std::optional<int>(c.gpus) : std::nullopt);
  }
  const std::string text = d.to_toml(c.model_only);
  if (!c.out.empty() && std::filesystem::exists(c.out) && !c.overwrite) {
    throw InputError(c.out + ": exists; pass --overwrite to replace it");
  }
  int rc = kExitOk;
  {
    // A model-only draft is checked as the [model] of a one-GPU training scenario, so every value and
    // model rule is checked the same way as in a full scenario.
    const std::string checked = c.model_only ? scenarios::ScenarioDraft::model_check_scenario(text) : text;
    try {
      scenarios::load_scenario_text(checked, c.out.empty() ? "<imported>" : c.out);
    } catch (const scenarios::ScenarioError& e) {
      std::cerr << "the imported scenario does not validate:\n";
      for (const auto& m : e.messages()) std::cerr << "  " << m << "\n";
      rc = kExitInputError;
    }
  }
  if (c.out.empty()) {
    std::cout << text;
  } else {
    std::ofstream f(c.out, std::ios::binary | std::ios::trunc);
    if (!(f << text) || !(f.flush())) throw SystemError(c.out + ": cannot write");
    std::cerr << "wrote " << c.out << (rc == kExitOk ? " (valid)" : " (NOT valid: fix the errors above)") << "\n";
  }
  return rc;
}

}  // namespace

void register_import(CLI::App& app, Commands& cmds) {
  auto* imp = app.add_subcommand("import", "Write a scenario from a Megatron-LM launch or a Hugging Face config.json.");
  imp->require_subcommand(1);

  // ---- import megatron ----
  auto* meg = imp->add_subcommand(
      "megatron",
      "Megatron-LM arguments -> scenario. ARGS_FILE: a launch script, an argument list or a Megatron YAML; or "
      "`-- --num-layers 32 ...`. Unknown arguments are listed (stderr and TOML comments), never guessed.");
  static Common mc;
  static std::vector<std::string> items;
  static std::vector<std::string> vars;
  static int vocab = 0;
  meg->add_option("ARGS_FILE_OR_ARGS", items, "A file, or the Megatron arguments after `--`")->required();
  meg->add_option("--var", vars, "NAME=VALUE for ${NAME} in the launch (TP, GBS, ...); repeatable, one per --var")
      ->allow_extra_args(false);
  meg->add_option("--vocab-size", vocab, "Tokenizer size when the launch names a tokenizer file instead")
      ->check(CLI::Range(1, 100000000));
  add_common(meg, mc);
  cmds.add(meg, [] {
    scenarios::MegatronImportOptions o;
    for (const auto& v : vars) {
      const auto eq = v.find('=');
      if (eq == std::string::npos || eq == 0) throw InputError("--var '" + v + "': expected NAME=VALUE");
      o.vars[v.substr(0, eq)] = v.substr(eq + 1);
    }
    if (vocab > 0) o.vocab_size = vocab;
    o.name = mc.name;
    scenarios::ScenarioDraft d;
    if (items.size() == 1 && items[0].rfind("--", 0) != 0) {
      d = scenarios::import_megatron_file(items[0], o);
    } else if (!items.empty() && items[0].rfind("--", 0) == 0) {
      o.source = "command-line arguments";
      d = scenarios::import_megatron(scenarios::parse_megatron_argv(items, o.vars), o);
    } else {
      throw InputError("give one arguments file, or the Megatron arguments after `--` (got '" + items[0] + "' and " +
                       std::to_string(items.size() - 1) + " more)");
    }
    return finish(d, mc);
  });

  // ---- import hf ----
  auto* hf = imp->add_subcommand(
      "hf", "Hugging Face config.json -> [model] table (--model-only), or a full scenario with --cluster, --gpus, "
            "a layout (--tp --pp --ep ..., default 1) and --seq-length --global-batch-size.");
  static Common hc;
  static std::string config;
  static int tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1, etp = 1, mbs = 1, gbs = 0, seq = 0;
  static bool sp = false;
  hf->add_option("CONFIG_JSON", config, "The model's config.json")->required();
  hf->add_option("--tp", tp, "Tensor-parallel size")->check(CLI::Range(1, 1000000));
  hf->add_option("--pp", pp, "Pipeline-parallel size")->check(CLI::Range(1, 1000000));
  hf->add_option("--vpp", vpp, "Virtual pipeline stages per pipeline rank")->check(CLI::Range(1, 1000000));
  hf->add_option("--cp", cp, "Context-parallel size")->check(CLI::Range(1, 1000000));
  hf->add_option("--ep", ep, "Expert-parallel size")->check(CLI::Range(1, 1000000));
  hf->add_option("--etp", etp, "Expert tensor-parallel size")->check(CLI::Range(1, 1000000));
  hf->add_flag("--sequence-parallel", sp, "Sequence parallelism over the TP group");
  hf->add_option("--micro-batch-size", mbs, "Sequences per micro-batch")->check(CLI::Range(1, 1000000));
  hf->add_option("--global-batch-size", gbs, "Sequences per optimizer step (full scenario: required)")
      ->check(CLI::Range(1, 100000000));
  hf->add_option("--seq-length", seq, "Sequence length in tokens (full scenario: required)")->check(CLI::Range(1, 100000000));
  add_common(hf, hc);
  cmds.add(hf, [] {
    auto d = scenarios::import_hf_file(config);
    if (!hc.name.empty()) d.set("model", "name", hc.name);
    if (!hc.model_only) {
      if (gbs == 0 || seq == 0) {
        throw InputError("a full scenario needs --seq-length and --global-batch-size (or pass --model-only)");
      }
      const std::pair<const char*, int> layout[] = {{"tp", tp}, {"pp", pp}, {"vpp", vpp}, {"cp", cp}, {"ep", ep}, {"etp", etp}};
      for (const auto& [k, v] : layout) d.set("parallel", k, v);
      if (sp) d.set("parallel", "sequence_parallel", true);
      d.set("train", "micro_batch_size", mbs);
      d.set("train", "global_batch_size", gbs);
      d.set("train", "seq_length", seq);
    }
    return finish(d, hc);
  });
}

}  // namespace threewalls::cli
