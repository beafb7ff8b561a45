// run and calibrate in threewalls: listed with their summaries, run by threewalls-gpu (cli/CMakeLists.txt).
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "command.hpp"
#include "threewalls/core/error.hpp"

namespace threewalls::cli {

namespace {

constexpr const char* kGpuExecutable = "threewalls-gpu";

// The folder of the running executable (the link /proc/self/exe names), with a trailing '/'.
std::string own_folder() {
  std::string path(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
  if (n <= 0 || static_cast<std::size_t>(n) >= path.size()) {
    throw SystemError(std::string("cannot find the threewalls executable (/proc/self/exe): ") +
                      std::generic_category().message(errno));
  }
  path.resize(static_cast<std::size_t>(n));
  return path.substr(0, path.rfind('/') + 1);
}

// Replaces this process by threewalls-gpu with the same arguments (the same process id, so mpirun
// keeps track of it). Returns only by throwing.
int exec_gpu_executable(char** argv) {
  const std::string path = own_folder() + kGpuExecutable;
  ::execv(path.c_str(), argv);
  const int err = errno;
  if (err == ENOENT) {
    throw SystemError("this command runs in " + path + ", which is not built: build it with `cmake --build " +
                      "<build dir> --target " + kGpuExecutable + "` (the default target builds it too; " +
                      "`--target threewalls` builds the GPU-free commands only)");
  }
  throw SystemError("this command runs in " + path + ", which could not be started (" +
                    std::generic_category().message(err) + "); build the target " + kGpuExecutable +
                    " and keep it beside threewalls");
}

void add_forwarder(CLI::App& app, Commands& cmds, const char* name, const char* summary, char** argv) {
  CLI::App* sub = app.add_subcommand(name, summary);
  // Every argument, --help included, is threewalls-gpu's to parse.
  sub->set_help_flag();
  sub->prefix_command();
  sub->allow_extras();
  cmds.add(sub, [argv] { return exec_gpu_executable(argv); });
}

}  // namespace

void register_gpu_commands(CLI::App& app, Commands& cmds, char** argv) {
  add_forwarder(app, cmds, "run", kRunSummary, argv);
  add_forwarder(app, cmds, "calibrate", kCalibrateSummary, argv);
}

}  // namespace threewalls::cli
