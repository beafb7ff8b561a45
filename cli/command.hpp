#pragma once
// Each subcommand lives in its own cmd_<name>.cpp and registers itself here. Libraries throw;
// main() alone turns exceptions into exit codes (core/error.hpp).
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

namespace threewalls::cli {

using Runner = std::function<int()>;

class Commands {
 public:
  void add(CLI::App* sub, Runner run) { commands_.emplace_back(sub, std::move(run)); }
  [[nodiscard]] const std::vector<std::pair<CLI::App*, Runner>>& all() const { return commands_; }

 private:
  std::vector<std::pair<CLI::App*, Runner>> commands_;
};

// Registration functions, one per subcommand file.
void register_validate(CLI::App& app, Commands& cmds);
void register_describe(CLI::App& app, Commands& cmds);
void register_graph(CLI::App& app, Commands& cmds);
void register_sim(CLI::App& app, Commands& cmds);
void register_plan(CLI::App& app, Commands& cmds);  // plan and plan-merge (cmd_plan.cpp)
void register_compare(CLI::App& app, Commands& cmds);
void register_analyze(CLI::App& app, Commands& cmds);
void register_export(CLI::App& app, Commands& cmds);
void register_import(CLI::App& app, Commands& cmds);
void register_run(CLI::App& app, Commands& cmds);  // GPU builds only (THREEWALLS_HAVE_RUN)
// GPU builds only (THREEWALLS_HAVE_CALIBRATE).
void register_calibrate(CLI::App& app, Commands& cmds);

}  // namespace threewalls::cli
