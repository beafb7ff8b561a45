// Running a command through the shell from a test: the one popen loop of the test suite.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace threewalls::test {

// Runs `command` through /bin/sh and returns its exit code (128 + the signal when it was killed, -1 when
// it could not be started); `output` receives what it wrote to its stdout (redirect inside `command` to
// capture or drop stderr).
inline int run_shell(const std::string& command, std::string& output) {
  output.clear();
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return -1;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, n);
  const int status = ::pclose(pipe);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

// The threewalls binary of this build.
inline std::string threewalls_binary() { return std::string(THREEWALLS_BINARY_DIR) + "/cli/threewalls"; }

// `threewalls ARGS` with stderr folded into `output`.
inline int threewalls_cli(const std::string& args, std::string& output) {
  return run_shell(threewalls_binary() + " " + args + " 2>&1", output);
}

}  // namespace threewalls::test
