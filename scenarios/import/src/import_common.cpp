// The scenario draft shared by the importers, and the [cluster] presets (docs/import.md).
#include <algorithm>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include <toml++/toml.h>

#include "cluster_presets.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/input_file.hpp"
#include "threewalls/core/strings.hpp"
#include "threewalls/core/version.hpp"
#include "threewalls/scenarios/import.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/registry.hpp"

namespace threewalls::scenarios {

WindowLayers window_layers_of(const std::vector<int>& windowed) {
  WindowLayers w;
  const int n = static_cast<int>(windowed.size());
  w.any = std::find(windowed.begin(), windowed.end(), 1) != windowed.end();
  if (!w.any) return w;
  const auto first_full = std::find(windowed.begin(), windowed.end(), 0);
  const int freq = first_full == windowed.end() ? 0 : static_cast<int>(first_full - windowed.begin()) + 1;
  for (int l = 0; l < n; ++l) {
    const int want = freq > 0 && (l + 1) % freq == 0 ? 0 : 1;
    if (windowed[static_cast<std::size_t>(l)] != want) return w;
  }
  w.skip_freq = freq;
  return w;
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
  if (model_only) {
    os << "\n" << tables_.to_toml("model");
    return os.str();
  }
  ScenarioText text;
  text.set("", "schema_version", std::int64_t{kScenarioSchemaVersion});
  text.set("", "name", name);
  if (!description.empty()) text.set("", "description", description);
  os << text.to_toml() << "\n" << tables_.to_toml();
  return os.str();
}

std::string ScenarioDraft::model_check_scenario(const std::string& model_toml) {
  // Top-level keys must come before the first table header.
  return "schema_version = " + std::to_string(kScenarioSchemaVersion) + "\n" + model_toml +
         "\n[train]\nmicro_batch_size = 1\nglobal_batch_size = 1\nseq_length = 1\n"
         "\n[cluster]\ngpu = \"h100\"\ngpus_per_node = 1\nnodes = 1\n";
}

namespace {

// The keys of a [cluster] table (and its arrays of tables) read into the draft with the loader's
// checks: an unknown key or a bad value is an error naming the file and line.
void copy_cluster_keys(ScenarioDraft& d, const toml::table& table, const std::string& path, const std::string& file) {
  const Registry& reg = Registry::instance();
  for (auto&& [k, node] : table) {
    const std::string key(k.str());
    const SourceLocation where{file, static_cast<int>(node.source().begin.line),
                               static_cast<int>(node.source().begin.column)};
    if (const TableSpec* t = reg.find_table(path + "." + key); t != nullptr && t->is_array) {
      const auto* elements = node.as_array();
      if (elements == nullptr || !elements->is_array_of_tables()) {
        throw InputError(where, "'" + t->path + "' must be an array of tables, written [[" + t->path + "]]");
      }
      for (const auto& e : *elements) {
        d.add_element(t->path);
        copy_cluster_keys(d, *e.as_table(), t->path, file);
      }
      continue;
    }
    const ParamSpec* p = reg.find_param(path + "." + key);
    if (p == nullptr) {
      const auto allowed = reg.children(path);
      std::string msg = "[" + path + "] unknown key '" + key + "'";
      if (auto near = nearest(key, allowed)) msg += " (did you mean '" + *near + "'?)";
      throw InputError(where, msg + "; allowed here: " + join(allowed));
    }
    std::ostringstream literal;
    node.visit([&](const auto& n) {
      if constexpr (toml::is_value<decltype(n)> || toml::is_array<decltype(n)>) literal << n;
    });
    d.set(path, key, parse_literal(*p, literal.str(), where));
  }
}

}  // namespace

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> out;
  for (const auto& p : cluster_presets()) out.emplace_back(p.name);
  return out;
}

void add_cluster_table(ScenarioDraft& d, const std::string& preset_or_path, std::optional<int> gpus) {
  std::string text;
  std::string file;
  for (const auto& p : cluster_presets()) {
    if (preset_or_path == p.name) {
      text = p.toml;
      file = "scenarios/clusters/" + std::string(p.name) + ".toml";
    }
  }
  if (file.empty()) {
    std::error_code ec;
    if (!std::filesystem::exists(preset_or_path, ec)) {
      std::string msg = "--cluster '" + preset_or_path + "' is neither a preset (";
      const auto names = cluster_preset_names();
      for (std::size_t i = 0; i < names.size(); ++i) msg += (i ? ", " : "") + names[i];
      msg += ") nor a readable TOML file";
      if (auto near = nearest(preset_or_path, names)) msg += "; did you mean '" + *near + "'?";
      throw InputError(msg);
    }
    text = read_input_file(preset_or_path, "cluster file");
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
  const auto* cluster = root["cluster"].as_table();
  if (cluster == nullptr) throw InputError(SourceLocation{file, 0, 0}, "no [cluster] table");
  copy_cluster_keys(d, *cluster, "cluster", file);
  if (gpus) {
    const auto per_node = d.get("cluster", "gpus_per_node");
    if (!per_node) {
      throw InputError(SourceLocation{file, 0, 0}, "[cluster] needs gpus_per_node to apply --gpus");
    }
    const std::int64_t n = std::get<std::int64_t>(*per_node);
    if (*gpus < 1 || *gpus % n != 0) {
      throw InputError("--gpus " + std::to_string(*gpus) +
                       " is not a multiple of gpus_per_node = " + std::to_string(n) + " of " + file);
    }
    d.set("cluster", "nodes", std::int64_t{*gpus / n});
  }
}

}  // namespace threewalls::scenarios
