// Invariants of the one parameter registry (scenarios/src/registry.cpp). A registry entry that breaks
// one of these would leak into the parser, `threewalls describe` and the generated reference.
#include <set>

#include <gtest/gtest.h>

#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/registry.hpp"

namespace threewalls::scenarios {
namespace {

const Registry& reg() { return Registry::instance(); }

bool is_choice(ParamType t) { return t == ParamType::choice || t == ParamType::choice_list; }

TEST(Registry, EveryParamHasADescriptionATypeAndASetter) {
  ASSERT_GT(reg().params().size(), 50U);
  for (const auto& p : reg().params()) {
    EXPECT_FALSE(p.description.empty()) << p.path;
    EXPECT_STRNE(to_string(p.type), "?") << p.path;
    EXPECT_TRUE(static_cast<bool>(p.set)) << p.path;
    EXPECT_FALSE(p.unit_hint().empty()) << p.path;
  }
  for (const auto& t : reg().tables()) EXPECT_FALSE(t.description.empty()) << t.path;
}

TEST(Registry, NamesAreUniqueAndNoParamShadowsATable) {
  std::set<std::string> names;
  for (const auto& p : reg().params()) EXPECT_TRUE(names.insert(p.path).second) << "duplicate param " << p.path;
  for (const auto& t : reg().tables()) EXPECT_TRUE(names.insert(t.path).second) << "duplicate name " << t.path;
}

TEST(Registry, EveryParamLivesInADeclaredTable) {
  for (const auto& p : reg().params()) {
    if (p.table().empty()) continue;
    EXPECT_NE(reg().find_table(p.table()), nullptr) << p.path;
  }
  for (const auto& t : reg().tables()) {
    const auto dot = t.path.rfind('.');
    if (dot != std::string::npos) {
      EXPECT_NE(reg().find_table(t.path.substr(0, dot)), nullptr) << t.path;
    }
    for (const auto& other : t.exclusive_with) EXPECT_NE(reg().find_table(other), nullptr) << t.path << " / " << other;
  }
}

TEST(Registry, EveryChoiceParamListsChoicesAndOthersListNone) {
  for (const auto& p : reg().params()) {
    if (is_choice(p.type)) {
      EXPECT_FALSE(p.choices.empty()) << p.path;
      std::set<std::string> unique(p.choices.begin(), p.choices.end());
      EXPECT_EQ(unique.size(), p.choices.size()) << p.path << " lists a choice twice";
    } else {
      EXPECT_TRUE(p.choices.empty()) << p.path;
    }
  }
}

TEST(Registry, EveryParamIsRequiredOrHasADefaultOrADerivationButNotBoth) {
  // No silent defaults: an absent key is either an error, a documented default, or derived in words.
  for (const auto& p : reg().params()) {
    const int kinds = (p.required ? 1 : 0) + (p.default_toml.empty() ? 0 : 1) + (p.default_note.empty() ? 0 : 1);
    EXPECT_EQ(kinds, 1) << p.path;
  }
}

TEST(Registry, RangesAreOrderedAndOnlyOnNumbers) {
  for (const auto& p : reg().params()) {
    if (p.min && p.max) {
      EXPECT_LE(*p.min, *p.max) << p.path;
    }
    const bool quantity = p.type == ParamType::bytes || p.type == ParamType::bandwidth ||
                          p.type == ParamType::duration || p.type == ParamType::flop_rate;
    if (p.min || p.max) {
      EXPECT_TRUE(p.type == ParamType::integer || p.type == ParamType::real || quantity) << p.path;
    }
    // Every size, rate and duration has both bounds, so every value computed from one stays finite.
    if (quantity) {
      EXPECT_TRUE(p.min && p.max) << p.path << " declares no allowed range";
    }
  }
}

// `block` without the line that sets `key` (so the key can be written again without a TOML duplicate).
std::string without_key(const std::string& block, const std::string& key) {
  if (key.empty()) return block;
  std::string out;
  std::size_t start = 0;
  while (start < block.size()) {
    const auto end = block.find('\n', start);
    const std::string line = block.substr(start, end - start + 1);
    if (line.rfind(key + " = ", 0) != 0) out += line;
    start = end + 1;
  }
  return out;
}

// A valid scenario with `key_line` ("key = value", or "") written into `table`.
std::string host_scenario(const std::string& table, const std::string& key_line) {
  const std::string key = key_line.substr(0, key_line.find(" = "));
  auto block = [&](const std::string& name, const std::string& text) {
    return table == name ? without_key(text, key) + key_line + "\n" : text;
  };
  const std::string model =
      "[model]\nnum_layers = 4\nhidden_size = 512\nnum_attention_heads = 8\nffn_hidden_size = 2048\n"
      "vocab_size = 32000\nnum_experts = 8\nmoe_ffn_hidden_size = 256\nmoe_router_topk = 2\n";
  const std::string cluster = "[cluster]\ngpu = \"h100\"\ngpus_per_node = 8\nnodes = 1\n";
  const std::string train = "[train]\nmicro_batch_size = 1\nglobal_batch_size = 8\nseq_length = 1024\n";
  const std::string infer = "[infer]\nbatch_size = 1\nprompt_length = 16\ngenerate_tokens = 2\n";
  const std::string offload = "[infer.expert_offload]\ntier = \"hbm\"\ncache_experts_per_layer = 1\n";
  std::string text = block("", "schema_version = 1\n");
  text += block("model", model);
  text += block("cluster", cluster);
  const bool inference = table.rfind("infer", 0) == 0;
  text += inference ? block("infer", infer) : block("train", train);
  if (table == "infer.expert_offload") text += block(table, offload);
  if (table == "cluster.slowdown") text += block(table, "[[cluster.slowdown]]\nrank = 0\nfactor = 2.0\n");
  if (table != "" && table != "model" && table != "cluster" && table != "train" && table != "infer" &&
      table != "infer.expert_offload" && table != "cluster.slowdown") {
    text += "[" + table + "]\n" + key_line + "\n";
  }
  return text;
}

TEST(Registry, EveryDefaultParsesAndPassesItsOwnTypeAndRangeChecks) {
  // Writes each default explicitly and loads it. Consistency rules may object to a key merely being
  // written (e.g. q_lora_rank on an mha model), so only non-rule messages count as failures here.
  int checked = 0;
  for (const auto& p : reg().params()) {
    if (p.default_toml.empty() || p.required) continue;
    const std::string line = p.key() + " = " + p.default_toml;
    const std::string text = host_scenario(p.table(), line);
    ++checked;
    try {
      (void)load_scenario_text(text, "defaults.toml");
    } catch (const ScenarioError& e) {
      for (const auto& m : e.messages()) {
        EXPECT_NE(m.find("[rule "), std::string::npos) << p.path << " default " << p.default_toml << ":\n" << m;
      }
    }
  }
  EXPECT_GT(checked, 40);
}

TEST(Registry, HostScenariosForTheDefaultsTestAreThemselvesValid) {
  // Guards the test above: if its host scenario were broken, every default would "fail" for the
  // host's reason and the filter on rule messages could hide it.
  for (const auto& t : reg().tables()) {
    const std::string text = host_scenario(t.path, "");
    EXPECT_NO_THROW((void)load_scenario_text(text, "host.toml")) << t.path << "\n" << text;
  }
}

TEST(Registry, ChildrenListKeysAndSubTables) {
  const auto run = reg().children("run");
  EXPECT_NE(std::find(run.begin(), run.end(), "steps"), run.end());
  EXPECT_NE(std::find(run.begin(), run.end(), "profiler"), run.end());
  const auto top = reg().children("");
  EXPECT_NE(std::find(top.begin(), top.end(), "schema_version"), top.end());
  EXPECT_NE(std::find(top.begin(), top.end(), "model"), top.end());
}

TEST(Registry, TextReferenceOfOneTableListsOnlyItsKeys) {
  const std::string text = reg().text_reference("run.profiler");
  EXPECT_NE(text.find("record_every_n_steps"), std::string::npos);
  EXPECT_EQ(text.find("num_layers"), std::string::npos);
}

}  // namespace
}  // namespace threewalls::scenarios
