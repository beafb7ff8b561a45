#include <iostream>

#include "command.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/strings.hpp"
#include "threewalls/scenarios/registry.hpp"
#include "threewalls/scenarios/rules.hpp"

namespace threewalls::cli {

void register_describe(CLI::App& app, Commands& cmds) {
  auto* sub = app.add_subcommand("describe", "Describe the scenario language: every table and key, its type, "
                                             "unit, default and meaning.");
  static std::string table;
  static bool markdown = false;
  static bool rules = false;
  sub->add_option("table", table, "Only this table, e.g. train or run.profiler");
  sub->add_flag("--markdown", markdown, "Print docs/scenario_reference.md");
  sub->add_flag("--rules-markdown", rules, "Print docs/scenario_rules.md");
  cmds.add(sub, [] {
    const auto& reg = scenarios::Registry::instance();
    if (markdown && rules) throw InputError("describe: --markdown and --rules-markdown are exclusive");
    if (markdown) {
      std::cout << reg.markdown_reference();
      return kExitOk;
    }
    if (rules) {
      std::cout << scenarios::rules_markdown();
      return kExitOk;
    }
    if (!table.empty() && !reg.find_table(table)) {
      std::vector<std::string> names;
      for (const auto& t : reg.tables()) names.push_back(t.path);
      std::string msg = "describe: unknown table '" + table + "'";
      if (auto n = nearest(table, names)) msg += " (did you mean '" + *n + "'?)";
      throw InputError(msg + "; tables: " + join(names));
    }
    std::cout << reg.text_reference(table);
    if (table.empty()) {
      std::cout << "consistency rules\n";
      for (const auto& r : scenarios::consistency_rules()) std::cout << "  " << r.id << ": " << r.text << "\n";
    }
    return kExitOk;
  });
}

}  // namespace threewalls::cli
