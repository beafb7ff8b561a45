#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "threewalls/scenarios/loader.hpp"

namespace threewalls::test {

inline std::filesystem::path source_dir() { return THREEWALLS_SOURCE_DIR; }

inline std::vector<std::filesystem::path> example_scenarios() {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(source_dir() / "scenarios" / "examples")) {
    if (e.path().extension() == ".toml") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The held-out validation suites (scenarios/validation/<suite>/*.toml).
inline std::vector<std::filesystem::path> validation_scenarios() {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(source_dir() / "scenarios" / "validation")) {
    if (e.path().extension() == ".toml") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A scenario from TOML text; `extra` overrides are appended as extra tables/keys by the caller.
inline scenarios::Scenario scenario_from(const std::string& text) {
  return scenarios::load_scenario_text(text, "test.toml").scenario;
}

inline std::string small_moe(const std::string& parallel, const std::string& train_extra, int gpus,
                             const std::string& model_extra = "") {
  return "schema_version = 1\n[model]\nnum_layers = 4\nhidden_size = 1024\nnum_attention_heads = 8\n"
         "vocab_size = 32000\nnum_experts = 8\nmoe_ffn_hidden_size = 512\nmoe_router_topk = 2\n" +
         model_extra + "\n[parallel]\n" + parallel + "\n[train]\nmicro_batch_size = 1\nglobal_batch_size = 8\n" +
         "seq_length = 1024\n" + train_extra + "\n[cluster]\ngpu = \"h100\"\ngpus_per_node = " +
         std::to_string(gpus) + "\nnodes = 1\n";
}

}  // namespace threewalls::test
