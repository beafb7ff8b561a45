// threewalls: one subcommand per cmd_<name>.cpp. Built twice: as threewalls (every command that needs
// no GPU) and, in builds with the GPU parts, as threewalls-gpu (THREEWALLS_GPU_EXECUTABLE: run and
// calibrate, the commands that load the CUDA libraries), which threewalls execs for them.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "args.hpp"
#include "command.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/version.hpp"

namespace {

// The soft limit of open files raised to the hard limit: a run directory keeps one file open per
// recorded rank while it can (the writer reads the limit and reopens files past half of it).
void raise_open_file_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == lim.rlim_max) return;
  lim.rlim_cur = lim.rlim_max;
  (void)::setrlimit(RLIMIT_NOFILE, &lim);  // best effort: the writer works under any limit
}

}  // namespace

int main(int argc, char** argv) {
  using namespace threewalls;
  raise_open_file_limit();
  CLI::App app{
      "threewalls: where a distributed MoE training or inference step spends its time (compute, memory, "
      "communication, host overhead), simulated on SimGrid or measured on GPUs, from one scenario file."};
  app.name("threewalls");
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(tool_version()) + " (" + std::string(git_sha()) + ")");
  cli::Commands cmds;
#ifdef THREEWALLS_GPU_EXECUTABLE
  cli::register_run(app, cmds);
  cli::register_calibrate(app, cmds);
#else
  cli::register_validate(app, cmds);
  cli::register_describe(app, cmds);
  cli::register_graph(app, cmds);
  cli::register_sim(app, cmds);
  cli::register_plan(app, cmds);
  cli::register_compare(app, cmds);
  cli::register_analyze(app, cmds);
  cli::register_export(app, cmds);
  cli::register_import(app, cmds);
#ifdef THREEWALLS_HAVE_GPU_COMMANDS
  cli::register_gpu_commands(app, cmds, argv);
#endif
#endif
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const auto* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      std::cerr << "threewalls: " << cli::unknown_command_message(argv[1], names) << "\n";
      return kExitInputError;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitInputError;
  }
  for (const auto& [sub, run] : cmds.all()) {
    if (!sub->parsed()) continue;
    try {
      return run();
    } catch (const InputError& e) {
      std::cerr << cli::error_line(sub->get_name(), e.what()) << "\n";
      return kExitInputError;
    } catch (const SystemError& e) {
      std::cerr << cli::error_line(sub->get_name(), e.what()) << "\n";
      return kExitSystemError;
    } catch (const std::exception& e) {
      std::cerr << "threewalls " << sub->get_name() << ": internal error: " << e.what() << "\n";
      return kExitSystemError;
    }
  }
  return kExitInputError;
}
