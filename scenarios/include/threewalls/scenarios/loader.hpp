#pragma once
// Loading a scenario: TOML text -> registry-checked values -> Scenario -> consistency rules.
// Every problem found is reported (not just the first), each as "file:line:col: [table] message".
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/registry.hpp"
#include "threewalls/scenarios/scenario.hpp"

namespace threewalls::scenarios {

// Where each key (and table) was written, by key path ("parallel.tp", "parallel").
// Keys inside an array of tables carry their element index: "cluster.slowdown[1].rank".
using KeyLocations = std::map<std::string, SourceLocation>;

// All problems of one scenario file. what() lists them, one per line.
class ScenarioError : public InputError {
 public:
  explicit ScenarioError(std::vector<std::string> messages);
  [[nodiscard]] const std::vector<std::string>& messages() const { return messages_; }

 private:
  std::vector<std::string> messages_;
};

// Accumulates located messages; throw_if_any() raises one ScenarioError with all of them.
class ErrorList {
 public:
  void add(const SourceLocation& where, const std::string& message);
  [[nodiscard]] bool empty() const { return messages_.empty(); }
  [[nodiscard]] std::size_t size() const { return messages_.size(); }
  // Throws one ScenarioError listing every message, ordered by position in the file.
  void throw_if_any() const;

 private:
  struct Entry {
    int line;
    int column;
    std::string text;
  };
  std::vector<Entry> messages_;
};

struct LoadedScenario {
  Scenario scenario;
  KeyLocations locations;
};

// Parses and checks TOML text. `file` names the source in messages (and resolves relative paths).
// Throws ScenarioError.
LoadedScenario load_scenario_text(std::string_view text, const std::string& file);
// Reads `path` and calls load_scenario_text. Throws ScenarioError (also for unreadable files).
LoadedScenario load_scenario_file(const std::filesystem::path& path);
// Convenience: the Scenario only.
Scenario load_scenario(const std::filesystem::path& path);

// One value of key `p` written as a TOML literal ("4", "\"80GiB\"", "[1, 2]"), read with the loader's
// type, unit, choice and range checks, as if written `key = literal` at `where`. Throws ScenarioError.
Value parse_literal(const ParamSpec& p, std::string_view literal, const SourceLocation& where);

// Re-derives and re-checks a scenario changed in memory after loading (the planner varies the
// parallel layout and training options of a loaded scenario). `locations` says which keys count as
// given, as the loader's map does; set derived fields (parallel.dp, parallel.edp) to 0 to have them
// derived again. Applies exactly the loader's consistency rules. Throws ScenarioError listing every
// violated rule (messages carry "[rule <id>]").
void recheck_scenario(Scenario& s, const KeyLocations& locations);

}  // namespace threewalls::scenarios
