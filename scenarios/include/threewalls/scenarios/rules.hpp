#pragma once
// The consistency rules a scenario must satisfy, mostly as Megatron-Core's argument checks apply
// them. Each rule has a stable id that appears in its error message ("[rule world-size]").
#include <string>
#include <vector>

namespace threewalls::scenarios {

struct RuleInfo {
  std::string id;
  std::string text;
};

const std::vector<RuleInfo>& consistency_rules();
// Markdown for docs/scenario_rules.md (generated; a test checks it is up to date).
std::string rules_markdown();

}  // namespace threewalls::scenarios
