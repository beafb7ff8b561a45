#pragma once
// The one registry of scenario parameters. Every table and key of the scenario language is declared
// here once (type, unit, default or required, allowed values, description); the loader, the
// allow-list, `threewalls describe` and docs/scenario_reference.md are all driven by it.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "threewalls/scenarios/scenario.hpp"

namespace threewalls::scenarios {

enum class ParamType : std::uint8_t {
  integer,      // TOML integer
  real,         // TOML float or integer
  boolean,      // TOML boolean
  string,       // free text
  choice,       // one of `choices`; a choice "name:N" accepts "name:<positive integer>"
  choice_list,  // array of distinct strings, each one of `choices`
  int_list,     // array of integers
  rank_list,    // "all", "representatives" or an array of ranks
  bytes,        // string with a size unit: "80GiB"
  bandwidth,    // string with a rate unit: "450GBps", "400Gbps"
  duration,     // string with a time unit: "1.5us"
  flop_rate,    // string with a FLOP/s unit: "989TFLOPS"
};

const char* to_string(ParamType t);

// A parsed value. Units are converted to SI doubles (bytes, bytes/s, s, FLOP/s).
using Value = std::variant<std::int64_t, double, bool, std::string, std::vector<std::int64_t>, std::vector<std::string>>;

// Writes a parsed value into the scenario; `index` is the element for keys inside an array of tables.
using Setter = std::function<void(Scenario&, const Value&, std::size_t index)>;

struct ParamSpec {
  std::string path;  // "train.micro_batch_size"; inside an array of tables: "cluster.slowdown.rank"
  ParamType type = ParamType::integer;
  bool required = false;
  std::string default_toml;   // default as a TOML literal ("1", "\"bf16\"", "\"80GiB\""); empty: none
  std::string default_note;   // for defaults derived from other keys, in words
  std::string description;
  std::vector<std::string> choices;
  std::optional<double> min;
  std::optional<double> max;
  Setter set;

  [[nodiscard]] std::string table() const;  // "train"
  [[nodiscard]] std::string key() const;    // "micro_batch_size"
  [[nodiscard]] std::string unit_hint() const;
};

struct TableSpec {
  std::string path;  // "train", "infer.expert_offload", "cluster.slowdown"
  std::string description;
  bool required = false;
  bool is_array = false;                               // [[cluster.slowdown]]
  std::function<void(Scenario&)> on_present;           // creates optional parts (train/infer) or a new array element
  std::vector<std::string> exclusive_with;             // tables that must not appear together with this one
};

class Registry {
 public:
  static const Registry& instance();

  [[nodiscard]] const std::vector<TableSpec>& tables() const { return tables_; }
  [[nodiscard]] const std::vector<ParamSpec>& params() const { return params_; }
  [[nodiscard]] const ParamSpec* find_param(const std::string& path) const;
  [[nodiscard]] const TableSpec* find_table(const std::string& path) const;
  // Keys and sub-tables directly inside `table` ("" = top level).
  [[nodiscard]] std::vector<std::string> children(const std::string& table) const;
  [[nodiscard]] std::vector<const ParamSpec*> params_in(const std::string& table) const;

  // Markdown reference (docs/scenario_reference.md) and plain-text help (threewalls describe).
  [[nodiscard]] std::string markdown_reference() const;
  [[nodiscard]] std::string text_reference(const std::string& only_table = "") const;

  void add_table(TableSpec t) { tables_.push_back(std::move(t)); }
  void add_param(ParamSpec p) { params_.push_back(std::move(p)); }

 private:
  Registry();
  std::vector<TableSpec> tables_;
  std::vector<ParamSpec> params_;
};

}  // namespace threewalls::scenarios
