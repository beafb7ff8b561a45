#pragma once
// Writing scenarios: the way back from values to a scenario file, through the registry
// (registry.hpp). Every key is formatted by its declaration's type and read back by the loader to the
// same value, so a written file loads to the scenario it was written from (tests/scenarios/
// writer_test.cpp checks every shipped scenario).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "threewalls/scenarios/registry.hpp"
#include "threewalls/scenarios/scenario.hpp"

namespace threewalls::scenarios {

// The TOML literal of `v` as the value of key `p`: integers, shortest round-trip reals, escaped
// strings, arrays, and sizes, bandwidths and durations as unit strings ("79.6GiB", "50GBps", "1us")
// that the loader parses back to exactly `v`. std::logic_error when `v` holds another variant
// alternative than `p`'s type reads (integers are accepted for reals).
std::string toml_literal(const ParamSpec& p, const Value& v);

// A scenario file under construction: registry keys and their values, table by table in the order
// the tables were first set, keys in the order set. Only registry keys are accepted (std::logic_error
// otherwise: a bug in the caller); values are checked against the key's type only, the loader checks
// the rest when the text is loaded.
class ScenarioText {
 public:
  // Sets `table`.`key` ("" = top level) in the table's last element.
  void set(const std::string& table, const std::string& key, Value v);
  // Starts a new element of an array of tables ([[cluster.slowdown]]).
  void add_element(const std::string& table);
  // Marks a table present even when it gets no key (a table whose presence matters, e.g. [train]).
  void add_table(const std::string& table);
  [[nodiscard]] std::optional<Value> get(const std::string& table, const std::string& key) const;
  void erase(const std::string& table, const std::string& key);
  [[nodiscard]] bool has_table(const std::string& table) const;

  // The TOML text: top-level keys first, then each table. With `only_table` set, that table alone.
  [[nodiscard]] std::string to_toml(const std::string& only_table = "") const;

 private:
  struct Section {
    std::string table;
    bool array_element = false;
    std::vector<std::pair<const ParamSpec*, Value>> entries;
  };
  Section& section(const std::string& table);
  std::vector<Section> sections_;
};

// The keys of `s` worth writing: every key whose getter gives a value, except those equal to the
// registry default (and the tables present in `s`). Loading the result gives back `s` (source path
// and content hash aside; a calibration profile path comes back absolute).
ScenarioText scenario_text(const Scenario& s);

// The scenario file of `s`: `comments` as "# " lines, then scenario_text(s).to_toml().
std::string write_scenario(const Scenario& s, const std::vector<std::string>& comments = {});

}  // namespace threewalls::scenarios
