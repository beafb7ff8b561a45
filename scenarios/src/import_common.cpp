// The scenario draft shared by the importers, and the [cluster] presets (docs/import.md).
#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <toml++/toml.h>

#include "cluster_presets.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/strings.hpp"
#include "threewalls/scenarios/import.hpp"
#include "threewalls/scenarios/registry.hpp"

namespace threewalls::scenarios {

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string toml_int_list(const std::vector<int>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

std::string toml_string_list(const std::vector<std::string>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + toml_string(v[i]);
  return out + "]";
}

void ScenarioDraft::set(const std::string& table, const std::string& key, const std::string& toml_literal) {
  if (Registry::instance().find_param(table + "." + key) == nullptr) {
    throw std::logic_error("import: '" + table + "." + key + "' is not a registry key");
  }
  auto t = std::find_if(tables_.begin(), tables_.end(), [&](const auto& e) { return e.first == table; });
  if (t == tables_.end()) {
    tables_.push_back({table, {}});
    t = std::prev(tables_.end());
  }
  for (auto& [k, v] : t->second) {
    if (k == key) {
      v = toml_literal;
      return;
    }
  }
  t->second.emplace_back(key, toml_literal);
}

std::optional<std::string> ScenarioDraft::get(const std::string& table, const std::string& key) const {
  for (const auto& [table_name, entries] : tables_) {
    if (table_name != table) continue;
    for (const auto& [k, v] : entries) {
      if (k == key) return v;
    }
  }
  return std::nullopt;
}

void ScenarioDraft::erase(const std::string& table, const std::string& key) {
  for (auto& [table_name, entries] : tables_) {
    if (table_name != table) continue;
    entries.erase(std::remove_if(entries.begin(), entries.end(), [&](const auto& e) { return e.first == key; }),
                  entries.end());
  }
}

bool ScenarioDraft::has_table(const std::string& table) const {
  return std::any_of(tables_.begin(), tables_.end(), [&](const auto& e) { return e.first == table; });
}

std::vector<std::pair<std::string, std::string>> ImportReport::ignored_by_reason() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& n : ignored) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == n.reason; });
    if (it == out.end()) {
      out.emplace_back(n.reason, n.name);
    } else {
      it->second += ", " + n.name;
    }
  }
  return out;
}

namespace {

void comment_block(std::ostringstream& os, const std::string& title, const std::vector<ImportNote>& notes) {
  if (notes.empty()) return;
  os << "# " << title << ":\n";
  for (const auto& n : notes) os << "#   " << n.name << (n.reason.empty() ? "" : ": " + n.reason) << "\n";
}

}  // namespace

std::string ScenarioDraft::to_toml(bool model_only) const {
  std::ostringstream os;
  for (const auto& h : header) os << "# " << h << "\n";
  comment_block(os, "NOT UNDERSTOOD (not in the scenario; check them)", report.not_understood);
  comment_block(os, "NOT REPRESENTED (changes the step, but the scenario language has no key for it)",
                report.not_represented);
  if (!report.ignored.empty()) {
    os << "# ignored (no effect on what threewalls models):\n";
    for (const auto& [reason, names] : report.ignored_by_reason()) os << "#   " << names << ": " << reason << "\n";
  }
  if (!report.notes.empty()) {
    os << "# notes:\n";
    for (const auto& n : report.notes) os << "#   " << n << "\n";
  }
  if (!model_only) {
    os << "schema_version = 1\n";
    os << "name = " << toml_string(name) << "\n";
    if (!description.empty()) os << "description = " << toml_string(description) << "\n";
  }
  for (const auto& [table, entries] : tables_) {
    if (model_only && table != "model") continue;
    os << "\n[" << table << "]\n";
    for (const auto& [k, v] : entries) os << k << " = " << v << "\n";
  }
  if (!model_only && !cluster_toml.empty()) os << "\n" << cluster_toml;
  return os.str();
}

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> out;
  for (const auto& p : cluster_presets()) out.emplace_back(p.name);
  return out;
}

std::string cluster_table(const std::string& preset_or_path, std::optional<int> gpus) {
  std::string text;
  std::string file;
  for (const auto& p : cluster_presets()) {
    if (preset_or_path == p.name) {
      text = p.toml;
      file = "scenarios/clusters/" + std::string(p.name) + ".toml";
    }
  }
  if (file.empty()) {
    std::ifstream in(preset_or_path, std::ios::binary);
    if (!in) {
      std::string msg = "--cluster '" + preset_or_path + "' is neither a preset (";
      const auto names = cluster_preset_names();
      for (std::size_t i = 0; i < names.size(); ++i) msg += (i ? ", " : "") + names[i];
      msg += ") nor a readable TOML file";
      if (auto near = nearest(preset_or_path, names)) msg += "; did you mean '" + *near + "'?";
      throw InputError(msg);
    }
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
    file = preset_or_path;
  }
  toml::table root;
  try {
    root = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw InputError(SourceLocation{file, static_cast<int>(b.line), static_cast<int>(b.column)},
                     std::string(e.description()));
  }
  auto* cluster = root["cluster"].as_table();
  if (cluster == nullptr) throw InputError(SourceLocation{file, 0, 0}, "no [cluster] table");
  if (gpus) {
    const auto per_node = (*cluster)["gpus_per_node"].value<std::int64_t>();
    if (!per_node || *per_node < 1) {
      throw InputError(SourceLocation{file, 0, 0}, "[cluster] needs an integer gpus_per_node to apply --gpus");
    }
    if (*gpus < 1 || *gpus % *per_node != 0) {
      throw InputError("--gpus " + std::to_string(*gpus) + " is not a multiple of gpus_per_node = " +
                       std::to_string(*per_node) + " of " + file);
    }
    cluster->insert_or_assign("nodes", *gpus / *per_node);
  }
  toml::table out;
  out.insert("cluster", *cluster);
  std::ostringstream os;
  os << toml::toml_formatter{out, toml::format_flags::none} << "\n";
  return os.str();
}

}  // namespace threewalls::scenarios
