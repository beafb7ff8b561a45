#pragma once
// The one registry of scenario parameters. Every table and key of the scenario language is declared
// here once (type, unit, default or required, allowed values, description, and how the key reads and
// writes the Scenario); the loader, the writer (writer.hpp), the allow-list, `threewalls describe` and
// docs/scenario_reference.md are all driven by it.
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
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
  rank_list,    // one of kRankListWords or an array of ranks
  bytes,        // string with a size unit: "80GiB"
  bandwidth,    // string with a rate unit: "450GBps", "400Gbps"
  duration,     // string with a time unit: "1.5us"
  flop_rate,    // string with a FLOP/s unit: "989TFLOPS"
};

const char* to_string(ParamType t);

// The words a rank_list key takes besides an array of ranks, in RecordedRanks' order, and its allowed
// values as messages show them: "auto", "all", "representatives" or an array of ranks.
inline constexpr std::array<std::string_view, 3> kRankListWords = {"auto", "all", "representatives"};
std::string rank_list_allowed();

// A parsed value. Units are converted to SI doubles (bytes, bytes/s, s, FLOP/s).
using Value = std::variant<std::int64_t, double, bool, std::string, std::vector<std::int64_t>, std::vector<std::string>>;

// Writes a parsed value into the scenario; `index` is the element for keys inside an array of tables.
using Setter = std::function<void(Scenario&, const Value&, std::size_t index)>;
// Reads the key's value out of a scenario, in the variant alternative its Setter takes (so that
// set(get(s)) leaves s unchanged). Returns nothing when the key is not to be written for this
// scenario: it does not apply (an MLA dimension of a GQA model) or, being derived, the loader derives
// it when absent (num_query_groups of MHA). Called only while the key's table is present (count > 0).
using Getter = std::function<std::optional<Value>(const Scenario&, std::size_t index)>;

struct ParamSpec {
  std::string path;  // "train.micro_batch_size"; inside an array of tables: "cluster.slowdown.rank"
  ParamType type = ParamType::integer;
  bool required = false;
  std::string default_toml;   // default as a TOML literal ("1", "\"bf16\"", "\"80GiB\""); empty: none
  std::string default_note;   // for defaults derived from other keys, in words
  std::string description;
  std::vector<std::string> choices;
  std::optional<double> min;  // allowed range, in SI units for sizes, rates and durations
  std::optional<double> max;
  Setter set;
  Getter get;

  [[nodiscard]] std::string table() const;  // "train"
  [[nodiscard]] std::string key() const;    // "micro_batch_size"
  [[nodiscard]] std::string unit_hint() const;
  // A value of this key as messages and the reference show it: with its unit for sizes, rates and
  // durations ("1 MB/s"), integers in full.
  [[nodiscard]] std::string format_value(double v) const;
  // Position of `text` among `choices` (exact names; "name:N" patterns are not matched), or nothing.
  [[nodiscard]] std::optional<std::size_t> choice_index(std::string_view text) const;
};

struct TableSpec {
  std::string path;  // "train", "infer.expert_offload", "cluster.slowdown"
  std::string description;
  bool required = false;
  bool is_array = false;                               // [[cluster.slowdown]]
  std::function<void(Scenario&)> on_present;           // creates optional parts (train/infer) or a new array element
  std::vector<std::string> exclusive_with;             // tables that must not appear together with this one
  // How often the table is present in a scenario: 0 or 1, or the elements of an array of tables.
  // Empty: always present once (its keys have defaults, so an absent table reads the same).
  std::function<std::size_t(const Scenario&)> count;
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

// The enum values of a choice key: the registry declares each enum's choices in the enum's order, so
// the name of `v` is choices[v] (to_string in scenario.hpp) and back. `path` must name a choice key
// (std::logic_error otherwise: a bug, not an input error).
const ParamSpec& choice_param(const std::string& path);
template <class E>
std::optional<E> choice_value(const std::string& path, std::string_view text) {
  const auto i = choice_param(path).choice_index(text);
  return i ? std::optional<E>(static_cast<E>(*i)) : std::nullopt;
}

}  // namespace threewalls::scenarios
